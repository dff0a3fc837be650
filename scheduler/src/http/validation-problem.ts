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

export function describeValidation(validation: readonly FastifySchemaValidationError[], context: string | undefined): FieldError {
  const first = validation[0];
  const where = context ?? 'request';
  if (!first) return { field: where, message: 'is invalid' };
  const path = first.instancePath;
  const field = path ? `${where}${path}` : where;
  const allowed = validation
    .filter((e) => e.instancePath === path && e.keyword === 'const')
    .map((e) => (e.params as { allowedValue?: unknown }).allowedValue);
  if (allowed.length > 0) return { field, message: `must be one of ${allowed.map((v) => JSON.stringify(v)).join(', ')}` };
  if (first.keyword === 'enum') {
    const values = (first.params as { allowedValues?: unknown[] }).allowedValues ?? [];
    return { field, message: `must be one of ${values.map((v) => JSON.stringify(v)).join(', ')}` };
  }
  if (first.keyword === 'required') {
    const missing = (first.params as { missingProperty?: string }).missingProperty;
    return { field: missing ? `${field}/${missing}` : field, message: 'is required' };
  }
  if (first.keyword === 'additionalProperties') {
    const extra = (first.params as { additionalProperty?: string }).additionalProperty;
    return { field: extra ? `${field}/${extra}` : field, message: 'is not a known member' };
  }
  return { field, message: first.message ?? 'is invalid' };
}
