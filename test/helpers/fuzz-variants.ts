/**
 * Hostile requests for every operation of an OpenAPI document. Each variant starts from a valid
 * request (real ids, a body the document accepts) and changes one thing: a path parameter (bad
 * ids, another org's id, bad percent-encoding, very long), a query parameter, a header, the
 * credential, the content type, the size of the body or one member of it (fuzz-values.ts). A
 * variant says what it changed, so a finding names it, and what the answer must be when that is
 * fixed by the contract (401 for a bad credential, 404 for another org's id, 413 for a body over
 * the limit, 415 for a body that is not JSON).
 */
import { mutations, sample, type Json, type Rng, type Schema } from './fuzz-values.js';

export interface DocParam {
  name: string;
  in: 'path' | 'query' | 'header' | 'cookie';
  required: boolean;
  schema: Schema;
}

export interface DocOperation {
  operationId: string;
  method: string;
  /** The document's path template, `/v1/desktops/{id}`. */
  template: string;
  params: DocParam[];
  body: { mediaType: string; schema: Schema; required: boolean } | null;
  responses: Record<string, { content?: Record<string, { schema?: Schema }> }>;
  /** Needs no credential (`security: []`). */
  public: boolean;
}

/** `schema` with every `#/components/schemas/…` reference replaced by what it names. */
export function inlineRefs(doc: any, schema: unknown, depth = 0): any {
  if (Array.isArray(schema)) return schema.map((s) => inlineRefs(doc, s, depth));
  if (typeof schema !== 'object' || schema === null || depth > 32) return schema;
  const ref = (schema as { $ref?: unknown }).$ref;
  if (typeof ref === 'string' && ref.startsWith('#/components/schemas/')) {
    const { $ref: _ref, ...siblings } = schema as Record<string, unknown>;
    return { ...inlineRefs(doc, doc.components?.schemas?.[ref.slice('#/components/schemas/'.length)], depth + 1), ...siblings };
  }
  return Object.fromEntries(Object.entries(schema).map(([k, v]) => [k, inlineRefs(doc, v, depth + 1)]));
}

export function operationsOf(doc: any): DocOperation[] {
  const out: DocOperation[] = [];
  for (const [template, item] of Object.entries<Record<string, any>>(doc.paths ?? {})) {
    for (const [method, op] of Object.entries<any>(item)) {
      if (!['get', 'put', 'post', 'patch', 'delete'].includes(method)) continue;
      const [mediaType, media] = Object.entries<any>(op.requestBody?.content ?? {})[0] ?? [];
      // A reference left unresolved would hide the body's members from the generator.
      if (JSON.stringify(inlineRefs(doc, media?.schema ?? {})).includes('"$ref"')) throw new Error(`${method} ${template}: a $ref outside components/schemas`);
      out.push({
        operationId: op.operationId ?? `${method} ${template}`,
        method: method.toUpperCase(),
        template,
        params: inlineRefs(doc, [...(item.parameters ?? []), ...(op.parameters ?? [])]),
        body: mediaType ? { mediaType, schema: inlineRefs(doc, media.schema ?? {}), required: op.requestBody.required === true } : null,
        responses: op.responses ?? {},
        public: Array.isArray(op.security) && op.security.length === 0,
      });
    }
  }
  return out;
}

/** What the test knows of the world: valid values per parameter, this org's and another's. */
export interface Targets {
  /** A valid value of a path parameter for `op`, in the fuzzing org and (when it has one) in the other org. */
  param(op: DocOperation, name: string): { own: string; other?: string };
  /** A request body the operation accepts, when the document's own examples will not do. */
  body(op: DocOperation): Json | undefined;
  /** The fuzzing org's credential. */
  key: string;
}

export interface Variant {
  op: DocOperation;
  /** What was changed, e.g. `path id: %ff` or `body actions[]<key>.combo: "true"`. */
  label: string;
  /** The family a finding is grouped by: `path id`, `body actions[]<key>.combo`, `auth`. */
  family: string;
  method: string;
  /** The request target exactly as it goes on the wire. */
  target: string;
  headers: Record<string, string>;
  body?: Buffer;
  /** Sent with `Transfer-Encoding: chunked` (no length up front). */
  chunked?: boolean;
  /** The parsed JSON body, when the body is JSON, for the check against the document's schema. */
  json?: { value: Json } | { unparsable: true };
  /** Only the body differs from the valid request: the document decides whether it is acceptable. */
  bodyOnly: boolean;
  /** The statuses the contract allows for this change, when it decides. */
  expect?: number[];
  /** Text that must not come back (the garbage sent). */
  noEcho?: string;
  /** Carries a member the schema does not name (unknown or misspelled): 400 once unknown members are refused. */
  unknownMember?: boolean;
}

const MiB = 1024 * 1024;

/** Bad values for an id-like path parameter whose pattern names a prefix (`^dsk_[0-9a-v]{24}$`). */
function badIds(valid: string, rng: Rng): Array<[string, string, number[]?]> {
  const prefix = /^([a-z]+_)/.exec(valid)?.[1] ?? '';
  const tail = valid.slice(prefix.length);
  return [
    ['short', `${prefix}${tail.slice(1)}`],
    ['long', `${valid}0`],
    ['other alphabet', `${prefix}${'w'.repeat(tail.length || 24)}`],
    ['upper case', valid.toUpperCase()],
    ['other kind', `${prefix === 'op_' ? 'dsk_' : 'op_'}${tail}`],
    ['no prefix', tail || rng.token(24)],
    ['%ff', '%ff'],
    ['%zz', '%zz'],
    ['overlong slash', '%c0%af'],
    ['lone %', '%'],
    ['encoded NUL', `${valid}%00`],
    ['encoded slash', `${valid}%2F..%2F..`],
    ['dot dot', '..'],
    ['encoded dot dot', '%2e%2e'],
    ['bidi', `%E2%80%AE${valid}`],
    ['SQL', `'%20OR%20'1'%3D'1`],
    // Under Fastify's 8 KiB parameter cap: a long id, not a long URL (the raw-socket part sends those).
    ['4 KiB', `${prefix}${'a'.repeat(4 * 1024)}`],
    ['matrix', `${valid};x=1`],
  ];
}

/** Bad guest paths. None can name a real directory: a DELETE of one must not hurt the desktop. */
const BAD_GUEST_PATHS: Array<[string, string]> = [
  ['empty', ''],
  ['root', '/'],
  ['dot', '.'],
  ['dot dot', 'tmp/canto-fuzz/../../etc/shadow'],
  ['encoded dot dot', 'tmp/canto-fuzz/%2e%2e/%2e%2e/etc/shadow'],
  ['encoded NUL', 'tmp/canto-fuzz/a%00b'],
  ['%ff', 'tmp/canto-fuzz/%ff'],
  ['lone %', 'tmp/canto-fuzz/%'],
  ['missing', 'tmp/canto-fuzz/no-such-file'],
  ['5 KiB', `tmp/canto-fuzz/${'a'.repeat(5 * 1024)}`],
  ['long segment', `tmp/canto-fuzz/${'b'.repeat(300)}`],
  ['bidi', 'tmp/canto-fuzz/%E2%80%AEtxt.exe'],
];

const BAD_PORTS = ['0', '65536', '-1', '1e3', '8080.5', 'abc', '%ff', '99999999999999999999'];
const BAD_QUERY = ['', 'x', '-1', '0', '1.5', '1e3', 'true%20', '%ff', '%00', '99999999999999999999', '9007199254740993'];
const BAD_AUTH: Array<[string, string | undefined]> = [
  ['none', undefined],
  ['scheme only', 'Bearer'],
  ['garbage', 'Bearer garbage'],
  ['basic', 'Basic Zm9vOmJhcg=='],
  ['8 KiB token', `Bearer svc_sk_${'A'.repeat(8 * 1024)}`],
];

function fill(template: string, values: Record<string, string>): string {
  return template.replace(/\{([^}]+)\}/g, (_, name: string) => values[name] ?? '');
}

/** Every hostile variant of `op`, deterministic for a given `rng` state. */
export function variantsFor(op: DocOperation, targets: Targets, rng: Rng): Variant[] {
  const pathParams = op.params.filter((p) => p.in === 'path');
  const own = Object.fromEntries(pathParams.map((p) => [p.name, targets.param(op, p.name).own]));
  const bodyIsJson = op.body?.mediaType === 'application/json';
  const given = op.body ? targets.body(op) : undefined;
  const baseBody: Json | undefined = bodyIsJson ? (given ?? sample(op.body!.schema)) : undefined;
  const baseHeaders: Record<string, string> = { authorization: `Bearer ${targets.key}` };
  if (op.body) baseHeaders['content-type'] = op.body.mediaType;
  const out: Variant[] = [];
  const base = (): Omit<Variant, 'label' | 'family'> => ({
    op,
    method: op.method,
    target: fill(op.template, own),
    headers: { ...baseHeaders },
    bodyOnly: false,
    ...(baseBody !== undefined ? { body: Buffer.from(JSON.stringify(baseBody)), json: { value: baseBody } } : {}),
    ...(op.body && !bodyIsJson ? { body: Buffer.from(String(given ?? 'canto fuzz\n')) } : {}),
  });
  const add: Add = (family, what, change) => out.push({ ...base(), label: `${family}: ${what}`, family, ...change });
  const withHeaders = (change: Record<string, string | undefined>) => {
    const headers = { ...baseHeaders };
    for (const [name, value] of Object.entries(change)) {
      if (value === undefined) delete headers[name];
      else headers[name] = value;
    }
    return headers;
  };

  add('valid', 'as documented', {});
  for (const p of pathParams) {
    const { other } = targets.param(op, p.name);
    const at = (value: string) => fill(op.template, { ...own, [p.name]: value });
    if (other !== undefined && other !== own[p.name]) add(`path ${p.name}`, "another org's", { target: at(other), expect: [404] });
    if (p.name === 'path') {
      for (const [what, value] of BAD_GUEST_PATHS) add(`path ${p.name}`, what, { target: at(value), noEcho: /%/.test(value) ? value : undefined });
    } else if (p.name === 'port') {
      for (const value of BAD_PORTS) add(`path ${p.name}`, value, { target: at(value), expect: [400, 404] });
    } else {
      for (const [what, value] of badIds(own[p.name]!, rng)) {
        add(`path ${p.name}`, what, { target: at(value), expect: [400, 404], noEcho: /%|\.\.|'/.test(value) ? value : undefined });
      }
    }
  }
  for (const p of op.params.filter((q) => q.in === 'query')) {
    const target = fill(op.template, own);
    for (const value of BAD_QUERY) add(`query ${p.name}`, JSON.stringify(value), { target: `${target}?${p.name}=${value}` });
    const enums = (p.schema.anyOf ?? [p.schema]).flatMap((s) => s.enum ?? []);
    if (enums.length) add(`query ${p.name}`, 'repeated', { target: `${target}?${p.name}=${String(enums[0])}&${p.name}=${String(enums.at(-1))}` });
    add(`query ${p.name}`, 'unknown parameter', { target: `${target}?fuzz_${rng.token(4)}=1` });
  }
  for (const p of op.params.filter((h) => h.in === 'header')) {
    const max = p.schema.maxLength ?? 255;
    for (const [what, value] of [['empty', ''], ['maxLength', 'k'.repeat(max)], ['maxLength+1', 'k'.repeat(max + 1)], ['latin-1', 'caf\u00e9']] as const) {
      add(`header ${p.name}`, what, { headers: withHeaders({ [p.name]: value }) });
    }
  }
  if (!op.public) {
    for (const [what, value] of BAD_AUTH) add('auth', what, { headers: withHeaders({ authorization: value }), expect: [401] });
    add('auth', 'key with a suffix', { headers: withHeaders({ authorization: `Bearer ${targets.key}x` }), expect: [401] });
    add('auth', 'lower-case scheme', { headers: withHeaders({ authorization: `bearer ${targets.key}` }) });
  }
  if (op.body && !bodyIsJson) rawBodyVariants(add, baseHeaders, rng);
  if (op.body && bodyIsJson) out.push(...jsonBodyVariants(op, base, baseBody ?? {}, rng));
  // A body nobody asked for, on an operation that takes none.
  if (!op.body && op.method !== 'GET' && op.method !== 'DELETE') {
    add('body', 'unexpected', { body: Buffer.from('{"fuzz":1}'), headers: withHeaders({ 'content-type': 'application/json' }) });
  }
  return out;
}

type Base = () => Omit<Variant, 'label' | 'family'>;
type Add = (family: string, what: string, change: Partial<Variant>) => void;

function rawBodyVariants(add: Add, headers: Record<string, string>, rng: Rng): void {
  add('raw body', 'empty', { body: Buffer.alloc(0) });
  add('raw body', 'random bytes', { body: rng.bytes(4096) });
  add('raw body', 'chunked', { body: rng.bytes(64 * 1024), chunked: true });
  add('raw body', 'labelled JSON', { body: Buffer.from('{"a":1}'), headers: { ...headers, 'content-type': 'application/json' } });
  add('raw body', 'no content type', { body: rng.bytes(16), headers: Object.fromEntries(Object.entries(headers).filter(([n]) => n !== 'content-type')) });
}

function jsonBodyVariants(op: DocOperation, base: Base, baseBody: Json, rng: Rng): Variant[] {
  const out: Variant[] = [];
  const headers = { ...base().headers, 'content-type': 'application/json' };
  const push = (family: string, what: string, change: Partial<Variant>) =>
    out.push({ ...base(), headers, label: `${family}: ${what}`, family, bodyOnly: true, ...change });
  const text = (family: string, what: string, raw: string | Buffer, change: Partial<Variant> = {}) => {
    const body = typeof raw === 'string' ? Buffer.from(raw) : raw;
    let json: Variant['json'];
    try {
      json = { value: JSON.parse(body.toString('utf8')) as Json };
    } catch {
      json = { unparsable: true };
    }
    push(family, what, { body, json: body.length === 0 ? undefined : json, ...change });
  };

  for (const m of mutations(op.body!.schema, baseBody, '', rng)) {
    const where = m.where === '' ? 'body' : `body ${m.where}`;
    const preview = JSON.stringify(m.value)?.slice(0, 40) ?? '';
    push(where, `${m.what} ${m.where === '' ? '' : preview}`.trim(), {
      body: Buffer.from(JSON.stringify(m.value)),
      json: { value: m.value },
      unknownMember: m.what === 'unknown member' || m.what === 'misspelled member',
    });
  }
  const valid = JSON.stringify(baseBody);
  text('body text', 'empty', '');
  // An empty body means `{}` (docs/api.md §2.4), whitespace included: the document has no say.
  text('body text', 'whitespace', ' \r\n\t', { json: undefined });
  for (const raw of ['null', '[]', '"x"', '1', 'true']) text('body text', raw, raw, { expect: [400] });
  for (const [what, raw] of [
    ['truncated', valid.slice(0, -1)],
    ['trailing comma', valid.replace(/}$/, ',}')],
    ['two documents', `${valid}${valid}`],
    ['single quotes', "{'fuzz':1}"],
    ['NaN', '{"x":NaN}'],
    ['1e400', valid.replace(/}$/, `${valid === '{}' ? '' : ','}"n":1e400}`)],
    ['__proto__', `{"__proto__":{"polluted":true}${valid === '{}' ? '' : `,${valid.slice(1, -1)}`}}`],
    ['constructor.prototype', '{"constructor":{"prototype":{"polluted":true}}}'],
    ['100k nesting', `${'['.repeat(100_000)}${']'.repeat(100_000)}`],
  ] as const) {
    // `__proto__` and `constructor` are members the schema does not name, refused by the parser.
    const unknownMember = what === '1e400' || what === '__proto__' || what === 'constructor.prototype';
    text('body text', what, raw, { unknownMember, ...(what === '1e400' ? {} : { expect: [400] }) });
  }
  const dup = /^\{"([^"]+)":/.exec(valid)?.[1];
  if (dup) text('body text', 'duplicate key', `{"${dup}":"fuzz-${rng.token(4)}",${valid.slice(1)}`);
  // RFC 8259 lets a parser ignore a BOM: whatever the answer, the document has no say.
  text('body text', 'BOM', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(valid)]), { json: undefined });
  const badUtf8 = [Buffer.from(valid.replace(/}$/, `${valid === '{}' ? '' : ','}"s":"`)), Buffer.from([0xc3, 0x28, 0xff]), Buffer.from('"}')];
  text('body text', 'invalid UTF-8', Buffer.concat(badUtf8), { unknownMember: true });

  for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/xml', 'application/jsonx']) {
    push('content-type', type, { headers: { ...headers, 'content-type': type }, expect: [415], json: undefined });
  }
  const { 'content-type': _label, ...unlabelled } = headers;
  push('content-type', 'none', { headers: unlabelled, expect: [400, 415], json: undefined });
  push('content-type', 'utf-16', {
    headers: { ...headers, 'content-type': 'application/json; charset=utf-16le' },
    body: Buffer.from(valid, 'utf16le'),
    expect: [400, 415],
    json: undefined,
  });
  const pad = `"fuzz_pad":"${'x'.repeat(2 * MiB)}"`;
  const huge = Buffer.from(valid === '{}' ? `{${pad}}` : valid.replace(/}$/, `,${pad}}`));
  push('size', 'over 2 MiB', { body: huge, expect: [413], json: undefined });
  push('size', 'over 2 MiB, chunked', { body: huge, chunked: true, expect: [413], json: undefined });
  return out;
}
