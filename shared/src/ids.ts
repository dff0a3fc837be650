/**
 * Resource ids: a short type prefix, an underscore, and 24 characters of lowercase base-32
 * (`0-9a-v`) drawn from 120 random bits. The prefix makes a pasted id self-describing and lets
 * the API reject a desktop id given where an operation id belongs before any lookup.
 */
import { randomBytes } from 'node:crypto';

export const ID_PREFIXES = {
  org: 'org',
  desktop: 'dsk',
  operation: 'op',
  generation: 'gen',
  host: 'host',
  apiKey: 'key',
  process: 'prc',
  layer: 'lyr',
  webhook: 'whk',
  delivery: 'dlv',
  port: 'prt',
  event: 'evt',
} as const;

export type IdKind = keyof typeof ID_PREFIXES;

const ALPHABET = '0123456789abcdefghijklmnopqrstuv';
const RANDOM_CHARS = 24;

export function newId(kind: IdKind): string {
  const bytes = randomBytes(RANDOM_CHARS);
  let out = '';
  for (const b of bytes) out += ALPHABET[b & 31];
  return `${ID_PREFIXES[kind]}_${out}`;
}

const patterns = Object.fromEntries(
  Object.entries(ID_PREFIXES).map(([k, p]) => [k, new RegExp(`^${p}_[0-9a-v]{${RANDOM_CHARS}}$`)]),
) as Record<IdKind, RegExp>;

export function isId(kind: IdKind, value: string): boolean {
  return patterns[kind].test(value);
}

/** The JSON-schema `pattern` for an id kind, used by route schemas. */
export function idPattern(kind: IdKind): string {
  return patterns[kind].source;
}
