/**
 * What a request that fails its schema is told: the field, and what it may be. Ajv's own words
 * ("must be equal to constant", "must match a schema in anyOf") name neither the allowed values nor
 * always the field; a union of literals (tier, billing_mode, claims, event types) fails as one
 * `const` error per literal, which together are the allowed values. The answer's `detail` is one
 * sentence about the first problem; the `errors` member lists it machine-readably as
 * `[{field, message}]`.
 */
import type { FastifySchemaValidationError } from 'fastify';

export interface FieldError {
  /** `body/tier`, `querystring/wait`, `params/id`: where, then the JSON pointer inside it. */
  field: string;
  message: string;
}

interface SchemaNode {
  properties?: Record<string, SchemaNode>;
  items?: SchemaNode;
  oneOf?: SchemaNode[];
  anyOf?: SchemaNode[];
  discriminator?: { propertyName: string };
  const?: unknown;
  $ref?: string;
}

/** Named schemas by `$id`, for the `$ref`s a route's schema holds (`InputAction_key#`). */
export type SchemaResolver = (id: string) => unknown;

/** The branches' values of a discriminated union's tag (`"mouse_move", "click", …`). */
function tagValues(node: SchemaNode, resolve: SchemaResolver): unknown[] {
  const tag = node.discriminator!.propertyName;
  return (node.oneOf ?? []).map((branch) => deref(branch, resolve)?.properties?.[tag]?.const);
}

function deref(node: SchemaNode | undefined, resolve: SchemaResolver): SchemaNode | undefined {
  return node?.$ref ? (resolve(node.$ref.replace(/#$/, '')) as SchemaNode | undefined) : node;
}

/**
 * The schema at a JSON pointer (`/actions/0`) of the request part, following a discriminated
 * union into the branch the data's tag names and a nullable object into the object; undefined
 * where it cannot be followed.
 */
function schemaAt(schema: unknown, pointer: string, data: unknown, resolve: SchemaResolver): SchemaNode | undefined {
  let node = schema as SchemaNode | undefined;
  let value = data;
  for (const segment of ['', ...pointer.split('/').slice(1)]) {
    if (segment !== '') {
      node = deref(node?.properties?.[segment] ?? (/^\d+$/.test(segment) ? node?.items : undefined), resolve);
      value = (value as Record<string, unknown> | undefined)?.[segment];
    }
    // A nullable object (`{…} | null`) is the object.
    const objects = node?.anyOf?.filter((branch) => branch.properties);
    if (objects?.length === 1) node = objects[0];
    if (node?.oneOf && node.discriminator) {
      const tagValue = (value as Record<string, unknown> | undefined)?.[node.discriminator.propertyName];
      const tag = node.discriminator.propertyName;
      node = node.oneOf.map((branch) => deref(branch, resolve)).find((branch) => branch?.properties?.[tag]?.const === tagValue) ?? node;
    }
  }
  return node;
}

const quoted = (values: readonly unknown[]) => values.map((v) => JSON.stringify(v)).join(', ');

/** Patterns whose meaning a person should read rather than decode (api/schemas.ts NO_NUL, NO_CONTROL). */
const PATTERN_WORDS: Readonly<Record<string, string>> = {
  '^[^\\u0000]*$': 'must not contain a NUL byte',
  '^[^\\p{Cc}]*$': 'must not contain control characters',
};

export function describeValidation(
  validation: readonly FastifySchemaValidationError[],
  context: string | undefined,
  schema?: unknown,
  data?: unknown,
  resolve: SchemaResolver = () => undefined,
): FieldError {
  const first = validation[0];
  const where = context ?? 'request';
  if (!first) return { field: where, message: 'is invalid' };
  const path = first.instancePath;
  const field = path ? `${where}${path}` : where;
  const allowed = validation
    .filter((e) => e.instancePath === path && e.keyword === 'const')
    .map((e) => (e.params as { allowedValue?: unknown }).allowedValue);
  if (allowed.length > 0) return { field, message: `must be one of ${quoted(allowed)}` };
  if (first.keyword === 'enum') {
    const values = (first.params as { allowedValues?: unknown[] }).allowedValues ?? [];
    return { field, message: `must be one of ${quoted(values)}` };
  }
  if (first.keyword === 'discriminator') {
    const node = schema === undefined ? undefined : schemaAt(schema, path, undefined, resolve);
    const tag = (first.params as { tag?: string }).tag ?? 'type';
    return { field: `${field}/${tag}`, message: node?.discriminator ? `must be one of ${quoted(tagValues(node, resolve))}` : 'is missing or unknown' };
  }
  if (first.keyword === 'required') {
    const missing = (first.params as { missingProperty?: string }).missingProperty;
    return { field: missing ? `${field}/${missing}` : field, message: 'is required' };
  }
  if (first.keyword === 'additionalProperties') {
    const extra = (first.params as { additionalProperty?: string }).additionalProperty;
    const known = Object.keys(schemaAt(schema, path, data, resolve)?.properties ?? {});
    const message = known.length > 0 ? `is not a known member; known: ${known.join(', ')}` : 'is not a known member';
    return { field: extra ? `${field}/${extra}` : field, message };
  }
  if (first.keyword === 'pattern') {
    const words = PATTERN_WORDS[(first.params as { pattern?: string }).pattern ?? ''];
    if (words) return { field, message: words };
  }
  return { field, message: first.message ?? 'is invalid' };
}
