/**
 * Values for the OpenAPI fuzz test: a seeded PRNG, a valid sample of a JSON schema, and the
 * hostile variants of a value at a place in a schema. Variants are enumerated, not drawn, so every
 * run sends the same requests: wrong types, boundaries (min-1, min, max, max+1), strings that
 * servers mishandle (empty, NUL, a lone surrogate, over the limit, text that reads as another
 * type), values outside an enum or a pattern, missing required members, unknown and misspelled
 * members, and deep nesting. The PRNG only fills in junk (tokens, bytes) and orders requests.
 */

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** The subset of JSON Schema (2020-12, as OpenAPI 3.1 uses it) that the document's bodies use. */
export interface Schema {
  type?: string | string[];
  properties?: Record<string, Schema>;
  required?: string[];
  additionalProperties?: boolean | Schema;
  items?: Schema;
  anyOf?: Schema[];
  oneOf?: Schema[];
  enum?: Json[];
  const?: Json;
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  maxItems?: number;
  maxProperties?: number;
  propertyNames?: Schema;
  patternProperties?: Record<string, Schema>;
  pattern?: string;
  default?: Json;
  example?: Json;
  examples?: Json[];
  [keyword: string]: unknown;
}

export interface Rng {
  /** A float in [0, 1). */
  next(): number;
  int(below: number): number;
  token(length: number): string;
  bytes(length: number): Buffer;
  shuffle<T>(items: T[]): T[];
}

/** mulberry32: tiny, fast, and the same sequence for the same seed on every platform. */
export function seededRng(seed: number): Rng {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (below: number) => Math.floor(next() * below);
  const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789';
  return {
    next,
    int,
    token: (length) => Array.from({ length }, () => alphabet[int(alphabet.length)]).join(''),
    bytes: (length) => Buffer.from(Array.from({ length }, () => int(256))),
    shuffle(items) {
      for (let i = items.length - 1; i > 0; i--) {
        const j = int(i + 1);
        [items[i], items[j]] = [items[j]!, items[i]!];
      }
      return items;
    },
  };
}

export function typesOf(schema: Schema): string[] {
  if (schema.type !== undefined) return Array.isArray(schema.type) ? schema.type : [schema.type];
  if (schema.enum?.length) return [...new Set(schema.enum.map((v) => (v === null ? 'null' : typeof v)))];
  if (schema.const !== undefined) return [schema.const === null ? 'null' : typeof schema.const];
  if (schema.properties) return ['object'];
  return [];
}

const branchesOf = (schema: Schema): Schema[] | undefined => schema.anyOf ?? schema.oneOf;

/** A value the schema accepts, built from examples, enums, defaults and minimums. */
export function sample(schema: Schema): Json {
  if (schema.example !== undefined) return schema.example;
  if (schema.examples?.length) return schema.examples[0]!;
  if (schema.const !== undefined) return schema.const;
  if (schema.enum?.length) return schema.enum[0]!;
  const branches = branchesOf(schema);
  if (branches) return sample(branches.find((b) => !typesOf(b).includes('null')) ?? branches[0]!);
  if (schema.default !== undefined) return schema.default;
  const type = typesOf(schema).find((t) => t !== 'null') ?? typesOf(schema)[0];
  switch (type) {
    case 'object':
      return Object.fromEntries((schema.required ?? []).map((name) => [name, sample(schema.properties?.[name] ?? {})]));
    case 'array':
      return Array.from({ length: Math.max(schema.minItems ?? 0, 1) }, () => sample(schema.items ?? {}));
    case 'integer':
    case 'number':
      return schema.minimum ?? 0;
    case 'boolean':
      return false;
    case 'null':
      return null;
    default:
      return 'x'.repeat(Math.max(schema.minLength ?? 1, 1));
  }
}

/** One hostile value and where in the body it went, e.g. `actions[].key.combo: "true"`. */
export interface Mutation {
  where: string;
  what: string;
  value: Json;
}

const KiB = 1024;

/** A JSON value nested `depth` levels deep, built without recursion. */
export function deepNesting(depth: number): Json {
  let value: Json = 1;
  for (let i = 0; i < depth; i++) value = i % 2 ? [value] : { n: value };
  return value;
}

/** Wrong-type stand-ins, each dropped where the schema allows its type. */
const WRONG_TYPES: ReadonlyArray<[string, Json]> = [
  ['null', null],
  ['boolean', true],
  ['number', 1.5],
  ['string', 'true'],
  ['array', []],
  ['object', {}],
];

function accepts(types: string[], type: string): boolean {
  if (types.length === 0) return true;
  if (type === 'number') return types.includes('number') || types.includes('integer');
  return types.includes(type);
}

function numberMutations(schema: Schema, integer: boolean): Array<[string, Json]> {
  const out: Array<[string, Json]> = [];
  if (schema.minimum !== undefined) out.push(['min-1', schema.minimum - 1], ['min', schema.minimum]);
  if (schema.maximum !== undefined) out.push(['max', schema.maximum], ['max+1', schema.maximum + 1]);
  out.push(['-1', -1], ['2^53+2', 2 ** 53 + 2], ['1e308', 1e308], ['-1e308', -1e308]);
  if (integer) out.push(['fraction', (schema.minimum ?? 0) + 0.5]);
  out.push(['numeric string', String(schema.minimum ?? 1)]);
  return out;
}

function stringMutations(schema: Schema, rng: Rng): Array<[string, Json]> {
  const out: Array<[string, Json]> = [
    ['empty', ''],
    ['"true"', 'true'],
    ['"null"', 'null'],
    ['NUL', 'a\u0000b'],
    ['lone surrogate', 'a\ud800b'],
    ['bidi and emoji', '\u202e\u{1f4a5}\u0301'],
    ['CRLF', 'a\r\nX-Injected: 1'],
    ['traversal', '../../../etc/passwd'],
    ['percent junk', '%ff%00%zz'],
    ['64 KiB', 'x'.repeat(64 * KiB)],
  ];
  if (schema.minLength !== undefined && schema.minLength > 1) out.push(['minLength-1', 'x'.repeat(schema.minLength - 1)]);
  if (schema.maxLength !== undefined) out.push(['maxLength', 'x'.repeat(schema.maxLength)], ['maxLength+1', 'x'.repeat(schema.maxLength + 1)]);
  if (schema.pattern !== undefined) out.push(['off pattern', `-${rng.token(6)} ${rng.token(3)}`]);
  return out;
}

/**
 * The hostile variants of the value at `where`, whose schema is `schema` and whose current
 * (valid) value is `current`. Objects and arrays recurse into their members down to `depth`.
 */
export function mutations(schema: Schema, current: Json, where: string, rng: Rng, depth = 4): Mutation[] {
  const out: Mutation[] = [];
  const push = (what: string, value: Json, at = where) => out.push({ where: at, what, value });
  const branches = branchesOf(schema);
  if (branches) {
    const nullable = branches.some((b) => typesOf(b).includes('null'));
    if (!nullable) push('null', null);
    const concrete = branches.filter((b) => !typesOf(b).includes('null'));
    const objects = concrete.filter((b) => typesOf(b).includes('object'));
    // A union of literals is an enum in disguise; a union of objects is a tagged union whose
    // every branch gets its own variants.
    if (objects.length > 1) {
      for (const branch of objects) {
        const literal = Object.values(branch.properties ?? {}).find((p) => p.const !== undefined || p.enum?.length === 1);
        const tag = literal?.const ?? literal?.enum?.[0];
        out.push(...mutations(branch, sample(branch), `${where}<${String(tag ?? objects.indexOf(branch))}>`, rng, depth));
      }
      return out;
    }
    if (concrete.every((b) => b.enum || b.const !== undefined)) {
      return [...out, ...mutations({ enum: concrete.flatMap((b) => b.enum ?? [b.const!]) }, current, where, rng, depth)];
    }
    return [...out, ...(concrete[0] ? mutations(concrete[0], current, where, rng, depth) : [])];
  }
  const types = typesOf(schema);
  for (const [type, value] of WRONG_TYPES) if (!accepts(types, type)) push(`wrong type ${type}`, value);
  if (schema.enum?.length) {
    const first = schema.enum[0];
    push('not in enum', `not-${rng.token(5)}`);
    if (typeof first === 'string' && first.toUpperCase() !== first) push('enum, other case', first.toUpperCase());
    if (typeof first === 'string') push('enum, padded', ` ${first} `);
    return out;
  }
  if (types.includes('integer') || types.includes('number')) {
    for (const [what, value] of numberMutations(schema, !types.includes('number'))) push(what, value);
  }
  if (types.includes('string')) for (const [what, value] of stringMutations(schema, rng)) push(what, value);
  if (types.includes('array') && depth > 0) {
    const item = schema.items ?? {};
    push('empty array', []);
    if (schema.maxItems !== undefined) push('maxItems+1', Array.from({ length: schema.maxItems + 1 }, () => sample(item)));
    for (const m of mutations(item, sample(item), `${where}[]`, rng, depth - 1)) push(m.what, [m.value], m.where);
  }
  if (types.includes('object') && depth > 0 && typeof current === 'object' && current !== null && !Array.isArray(current)) {
    out.push(...objectMutations(schema, current, where, rng, depth));
  }
  return out;
}

function objectMutations(schema: Schema, current: { [key: string]: Json }, where: string, rng: Rng, depth: number): Mutation[] {
  const out: Mutation[] = [];
  const at = (name: string) => (where ? `${where}.${name}` : name);
  const push = (what: string, value: Json, place = where) => out.push({ where: place, what, value });
  for (const name of schema.required ?? []) {
    const { [name]: _dropped, ...rest } = current;
    push(`missing required ${name}`, rest);
  }
  push('unknown member', { ...current, [`fuzz_${rng.token(4)}`]: 1 });
  const names = Object.keys(schema.properties ?? {});
  const typo = names.find((n) => n.length > 4 && !(schema.required ?? []).includes(n)) ?? names.find((n) => n.length > 4);
  if (typo) {
    // A misspelled optional member, the mistake a client makes (`idle_timout_secs`).
    const cut = typo.lastIndexOf('_') > 0 ? typo.lastIndexOf('_') + 2 : Math.floor(typo.length / 2);
    push('misspelled member', { ...current, [typo.slice(0, cut) + typo.slice(cut + 1)]: sample(schema.properties![typo]!) });
  }
  push('deep nesting', { ...current, [names[0] ?? 'nested']: deepNesting(2000) });
  if (schema.maxProperties === undefined && schema.additionalProperties && typeof schema.additionalProperties === 'object') {
    push('many members', Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`k${i}`, sample(schema.additionalProperties as Schema)])));
  }
  if (schema.maxProperties !== undefined) {
    const value = sample(typeof schema.additionalProperties === 'object' ? schema.additionalProperties : {});
    push('maxProperties+1', Object.fromEntries(Array.from({ length: schema.maxProperties + 1 }, (_, i) => [`K${i}`, value])));
  }
  if (schema.propertyNames?.pattern !== undefined || schema.patternProperties) {
    for (const key of ['', '1X', 'a-b', 'a\u0000b']) push(`key ${JSON.stringify(key)}`, { ...current, [key]: 'v' });
  }
  for (const name of names) {
    for (const m of mutations(schema.properties![name]!, current[name] ?? sample(schema.properties![name]!), at(name), rng, depth - 1)) {
      push(m.what, { ...current, [name]: m.value }, m.where);
    }
  }
  return out;
}
