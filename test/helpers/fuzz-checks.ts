/**
 * What the OpenAPI fuzz test asks of every answer, and how it talks to the server: requests go
 * out through node:http exactly as built (the path unnormalized, the body chunked or not), raw
 * exchanges through node:net. A broken rule becomes a finding rather than a failed assertion, so
 * one run reports every defect, grouped so that a hundred variants hitting one bug read as one line.
 */
import { Agent, request, STATUS_CODES, type IncomingHttpHeaders } from 'node:http';
import { connect } from 'node:net';
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import { inlineRefs, type DocOperation, type Variant } from './fuzz-variants.js';
import type { Json, Schema } from './fuzz-values.js';

export interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

export interface Finding {
  category: string;
  /** `POST /v1/desktops/{id}/input (sendInput)`, or the raw exchange's name. */
  where: string;
  family: string;
  label: string;
  status: number | string;
  snippet: string;
}

/**
 * A client that sends variants over a few kept-alive connections, and bodies over 64 KiB on a
 * connection of their own (a server may answer 413 and close before it has read them).
 */
export function fuzzClient(base: URL, maxSockets: number) {
  const agent = new Agent({ keepAlive: true, maxSockets });
  /** Sends a variant; answers what came back, or why nothing did within `timeoutMs`. */
  function send(v: Variant, timeoutMs: number): Promise<Answer | { error: string }> {
    return new Promise((resolve) => {
      const headers: Record<string, string | number> = { ...v.headers };
      if (v.body && !v.chunked) headers['content-length'] = v.body.length;
      const big = (v.body?.length ?? 0) > 64 * 1024;
      const req = request({ host: base.hostname, port: base.port, method: v.method, path: v.target, headers, agent: big ? false : agent });
      let done = false;
      const finish = (result: Answer | { error: string }) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve(result);
      };
      const timer = setTimeout(() => {
        finish({ error: `no answer within ${timeoutMs} ms` });
        req.destroy();
      }, timeoutMs);
      req.on('response', (res) => {
        const parts: Buffer[] = [];
        res.on('data', (c: Buffer) => parts.push(c));
        res.on('end', () => finish({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts) }));
        res.on('error', (err) => finish({ error: `answer cut: ${err.message}` }));
      });
      // A write error can come before the answer the server sent first: give it a moment.
      req.on('error', (err) => setTimeout(() => finish({ error: `connection failed: ${(err as NodeJS.ErrnoException).code ?? err.message}` }), 200));
      if (v.body && v.chunked) {
        for (let at = 0; at < v.body.length; at += 256 * 1024) req.write(v.body.subarray(at, at + 256 * 1024));
        req.end();
      } else {
        req.end(v.body);
      }
    });
  }
  return { send, close: () => agent.destroy() };
}

/** Writes `raw` on a fresh connection and parses what comes back before the server closes it. */
export function rawExchange(base: string, raw: string | Buffer, timeoutMs = 5000): Promise<Answer | { error: string }> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve) => {
    const socket = connect(Number(port), hostname);
    const parts: Buffer[] = [];
    let timedOut = false;
    socket.on('data', (c: Buffer) => parts.push(c));
    socket.on('error', () => socket.destroy());
    socket.setTimeout(timeoutMs, () => {
      timedOut = true;
      socket.destroy();
    });
    socket.on('close', () => {
      const data = Buffer.concat(parts);
      const split = data.indexOf('\r\n\r\n');
      const head = data.subarray(0, split < 0 ? data.length : split).toString('latin1');
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1] ?? 0);
      if (!status) return resolve({ error: timedOut ? `no answer within ${timeoutMs} ms` : 'connection closed without an answer' });
      const headers: IncomingHttpHeaders = {};
      for (const line of head.split('\r\n').slice(1)) {
        const colon = line.indexOf(':');
        if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
      }
      let body: Buffer = split < 0 ? Buffer.alloc(0) : data.subarray(split + 4);
      if (/chunked/i.test(String(headers['transfer-encoding'] ?? ''))) body = dechunk(body);
      // A 100 Continue comes before the real answer.
      if (status === 100 && split >= 0) return resolve(parseAfterContinue(data.subarray(split + 4)));
      resolve({ status, headers, body });
    });
    socket.end(raw);
  });
}

function parseAfterContinue(rest: Buffer): Answer | { error: string } {
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(rest.toString('latin1'))?.[1] ?? 0);
  return status ? { status, headers: {}, body: rest.subarray(rest.indexOf('\r\n\r\n') + 4) } : { error: '100 Continue and then nothing' };
}

function dechunk(body: Buffer): Buffer {
  const out: Buffer[] = [];
  let at = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', at);
    const size = eol < 0 ? 0 : parseInt(body.subarray(at, eol).toString('latin1'), 16);
    if (!size) return Buffer.concat(out);
    out.push(body.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
}

/** Literal strings of the test's machine (the checkout, state directories, the database URL) that no answer may carry. */
export interface LeakGuard {
  literals: string[];
}

const LEAKS: ReadonlyArray<[string, RegExp]> = [
  ['stack frame', /\n\s+at |\bat [\w$.<>]+ \([^)]*:\d+:\d+\)/],
  ['source path', /\/[\w./-]+\.[cm]?[jt]s\b(:\d+)?/],
  ['node_modules', /node_modules/],
  ['database URL', /postgres(ql)?:\/\//],
  ['node error code', /\bE(CONNREFUSED|CONNRESET|PIPE|NOENT|ACCES)\b/],
];

export const opName = (op: DocOperation) => `${op.method} ${op.template} (${op.operationId})`;

function snippetOf(a: Answer): string {
  const type = String(a.headers['content-type'] ?? '');
  if (a.body.length === 0) return '(empty)';
  if (!/json|text/.test(type)) return `(${type || 'no content-type'}, ${a.body.length} bytes)`;
  return a.body.toString('utf8', 0, 240).replace(/\s+/g, ' ');
}

/** The rules every answer with a status of 400 or more keeps, from any listener. */
export function problemFindings(a: Answer, leaks: LeakGuard, noEcho?: string): Array<[string, string?]> {
  const out: Array<[string, string?]> = [];
  if (a.status >= 500 && !(a.status === 503 && a.headers['retry-after'] !== undefined)) out.push([a.status === 503 ? '503 without Retry-After' : '5xx']);
  if (a.status < 400) return out;
  const type = String(a.headers['content-type'] ?? '');
  if (!/^application\/problem\+json\b/.test(type)) out.push(['not problem+json', `content-type ${type || '(none)'}`]);
  let json: any = null;
  try {
    json = JSON.parse(a.body.toString('utf8'));
  } catch {
    out.push(['not problem+json', 'body is not JSON']);
  }
  if (json !== null) {
    if (json.status !== a.status) out.push(['not problem+json', `status member ${JSON.stringify(json.status)}`]);
    if (typeof json.title !== 'string' || json.title === '') out.push(['not problem+json', 'no title']);
    if (typeof json.detail !== 'string' || json.detail === '') out.push(['not problem+json', 'no detail']);
  }
  const text = a.body.toString('utf8');
  for (const [what, pattern] of LEAKS) if (pattern.test(text)) out.push(['leak', what]);
  for (const literal of leaks.literals) if (literal && text.includes(literal)) out.push(['leak', 'a host path or secret of this machine']);
  if (text.length > 4096) out.push(['echo', `a ${text.length}-byte problem body`]);
  if (noEcho && (text.includes(noEcho) || text.includes(safeDecode(noEcho)))) out.push(['echo', 'the garbage sent comes back']);
  return out;
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** JSON-schema checks against the document: request bodies and 2xx answers. */
export class DocumentSchemas {
  private readonly ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: false });
  private readonly cache = new Map<string, ValidateFunction>();

  constructor(private readonly doc: any) {}

  private compile(key: string, schema: Schema): ValidateFunction {
    let fn = this.cache.get(key);
    if (!fn) {
      fn = this.ajv.compile(inlineRefs(this.doc, schema));
      this.cache.set(key, fn);
    }
    return fn;
  }

  bodyAccepted(op: DocOperation, value: Json): boolean {
    return this.compile(`req ${op.operationId}`, op.body!.schema)(value);
  }

  /** Null when a 2xx answer is what the document says, else what differs. */
  answerMismatch(op: DocOperation, a: Answer): string | null {
    const documented = op.responses[String(a.status)];
    if (!documented?.content) return null;
    const type = String(a.headers['content-type'] ?? '').split(';')[0]!.trim();
    const media = documented.content[type];
    if (!media) return `content-type ${type || '(none)'}, documented ${Object.keys(documented.content).join(', ')}`;
    if (!/json/.test(type) || !media.schema) return null;
    let json: unknown;
    try {
      json = JSON.parse(a.body.toString('utf8'));
    } catch {
      return 'body is not JSON';
    }
    const validate = this.compile(`res ${op.operationId} ${a.status} ${type}`, media.schema);
    return validate(json) ? null : `${validate.errors?.[0]?.instancePath || '/'} ${validate.errors?.[0]?.message ?? ''}`;
  }
}

export interface CheckContext {
  schemas: DocumentSchemas;
  leaks: LeakGuard;
  /** A 400 for a rule no JSON schema can state (a table of names, a byte length), by its detail. */
  unstated(op: DocOperation, detail: string): boolean;
}

/** Every rule one answer to one variant breaks. */
export function checkVariant(v: Variant, a: Answer | { error: string }, { schemas, leaks, unstated }: CheckContext): Finding[] {
  const where = opName(v.op);
  if ('error' in a) return [{ category: 'no answer', where, family: v.family, label: v.label, status: '-', snippet: a.error }];
  const out: Finding[] = [];
  const add = (category: string, note?: string) =>
    out.push({ category, where, family: v.family, label: v.label, status: a.status, snippet: note ? `${note}; ${snippetOf(a)}` : snippetOf(a) });
  for (const [category, note] of problemFindings(a, leaks, v.noEcho)) add(category, note);
  const documented = Object.keys(v.op.responses);
  if (!documented.includes(String(a.status)) && !documented.includes('default') && !documented.includes(`${String(a.status)[0]}XX`)) {
    add('status not in the document');
  }
  if (v.expect && !v.expect.includes(a.status)) add(`expected ${v.expect.join(' or ')}`);
  const ok = a.status >= 200 && a.status < 300;
  // Validation comes before any other check, so an unknown member is a 400 whatever else holds.
  if (v.unknownMember && a.status !== 400) add(ok ? 'unknown member accepted' : 'unknown member not refused');
  if (v.bodyOnly && v.json && v.op.body) {
    const accepted = 'value' in v.json ? schemas.bodyAccepted(v.op, v.json.value) : false;
    if (ok && !accepted && !v.unknownMember) add('accepted a body the document refuses');
    if (a.status === 400 && accepted && !v.unknownMember && !unstated(v.op, detailOf(a))) add('refused a body the document accepts');
  }
  if (ok) {
    const mismatch = schemas.answerMismatch(v.op, a);
    if (mismatch) add('answer not as documented', mismatch);
  }
  return out;
}

function detailOf(a: Answer): string {
  try {
    return String(JSON.parse(a.body.toString('utf8')).detail ?? '');
  } catch {
    return '';
  }
}

/** The findings grouped by rule, operation, variant family and status, one line each. */
export function formatFindings(findings: Finding[]): string {
  const groups = new Map<string, Finding[]>();
  for (const f of findings) {
    const key = [f.category, f.where, f.family, f.status].join('\u0000');
    groups.set(key, [...(groups.get(key) ?? []), f]);
  }
  const lines = [...groups.values()].map((group) => {
    const f = group[0]!;
    const labels = [...new Set(group.map((g) => g.label))];
    const shown = labels.slice(0, 3).join(' | ') + (labels.length > 3 ? ` | … (${labels.length} variants)` : '');
    const status = typeof f.status === 'number' ? `${f.status} ${STATUS_CODES[f.status] ?? ''}`.trim() : f.status;
    return `- [${f.category}] ${f.where} → ${status} ×${group.length}: ${shown}\n    answer: ${f.snippet}`;
  });
  return `${groups.size} findings (${findings.length} answers):\n${lines.sort().join('\n')}`;
}
