/**
 * Hostile input against the whole API, driven by its own OpenAPI document. A real scheduler, a
 * real agent on the sandbox runtime and a real PostgreSQL; two orgs, each with an awake desktop, a
 * detached process, an exposed port, a webhook and a spare key, so that every operation reaches
 * real targets and every id has a twin in the other org. For every operation in the served
 * document, seeded variants of a valid request (fuzz-variants.ts) change one thing each: bad ids,
 * the other org's ids, bad percent-encoding, wrong types and boundary values in the body, unknown
 * members, malformed JSON, wrong content types, bodies over the limit, bad credentials. A second
 * part writes malformed HTTP framing on raw sockets to the API and the port ingress.
 *
 * Every answer must come within 10 s, never be a 5xx (a 503 only with Retry-After), be
 * problem+json with a matching `status` when it is 400 or more, leak no stack, path or secret,
 * not echo the garbage, and agree with the document: a status it lists, a 2xx body it describes,
 * no 2xx for a body its schema refuses. Bad input is the client's fault, so a 500 is our bug even
 * where docs/api.md keeps one for real guest failures: anything that could be checked up front must
 * be. The test collects every finding and fails once with the whole list, grouped, so that one
 * run says everything that is wrong.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { seededRng, type Json } from '../helpers/fuzz-values.js';
import { operationsOf, variantsFor, type DocOperation, type Targets, type Variant } from '../helpers/fuzz-variants.js';
import {
  checkVariant, DocumentSchemas, formatFindings, fuzzClient, opName, problemFindings, rawExchange,
  type CheckContext, type Finding, type LeakGuard,
} from '../helpers/fuzz-checks.js';

const isRoot = process.getuid?.() === 0;
const SEED = 0x5eed_c0de;
const ANSWER_TIMEOUT_MS = 10_000;
const CONCURRENCY = 6;
/** The run is bounded: more variants than this means the generator grew and needs a look. */
const MAX_REQUESTS = 3000;

interface Org {
  call: ReturnType<typeof api>;
  key: string;
  desktop: string;
  wakeOp: string;
  processId: string;
  webhook: string;
  spareKey: string;
}

/** Operations whose desktop id gets a desktop of its own: they change its state or settings. */
const OWN_DESKTOP_OPS = ['wakeDesktop', 'hibernateDesktop', 'destroyDesktop', 'forkDesktop', 'updateDesktop'];

/** Valid bodies, where a sample from the schema would not do anything useful. */
const BODIES: Record<string, Json> = {
  createDesktop: { tier: 'small' },
  execCommand: { command: 'true' },
  forkDesktop: { count: 1, acknowledge_shared_state: true },
  setDisplay: { width: 1024, height: 768 },
  sendInput: { actions: [{ type: 'mouse_move', x: 10, y: 10 }] },
  createStreamTicket: { claim: 'view' },
  createTerminalTicket: { cols: 80, rows: 24 },
  exposePort: { port: 8081 },
  createWebhook: { url: 'https://hooks.example.com/canto-fuzz', events: ['desktop.destroyed'] },
  writeFile: 'canto fuzz\n',
};

/**
 * Rules the server keeps that a JSON schema cannot state, so a body the document accepts may still
 * be refused for them. Any other 400 for a body the document accepts means the document is missing
 * a rule (a pattern, a limit) that clients need to know.
 */
const UNSTATED_RULES: ReadonlyArray<[operationId: string, detail: RegExp]> = [
  // Key names are checked against the X keysym table.
  ['sendInput', /key name|keysym/i],
  // Text limits are in UTF-8 bytes; JSON Schema counts characters.
  ['sendInput', /over \d+ bytes/],
  // A click takes x and y together or neither (said in its description, not as a keyword the
  // server's draft-07 validator would compile).
  ['sendInput', /needs both x and y/],
  // Where a webhook URL's host points is decided by resolving it; whether plain http is allowed
  // depends on the deployment; the WHATWG parser is the judge of a URL's finer syntax.
  ['createWebhook', /loopback|link-local|private|resolv|must use https|absolute URL|name a host|userinfo/i],
];

describe.skipIf(!isRoot)('the API under seeded hostile input, driven by its OpenAPI document', () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let doc: any;
  let a: Org;
  let b: Org;
  const spares: Record<string, string> = {};
  const reached = new Set<string>();

  async function awake(call: ReturnType<typeof api>): Promise<{ desktop: string; wakeOp: string }> {
    const desktop = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    const woke = await call('POST', `/v1/desktops/${desktop}/wake`);
    expect(woke.status, woke.text).toBe(202);
    await until(async () => (await call('GET', `/v1/desktops/${desktop}`)).json.state === 'awake', 60_000, 'the desktop to wake');
    return { desktop, wakeOp: woke.json.id };
  }

  async function org(name: string): Promise<Org> {
    const key = await mintKey(scheduler.databaseUrl, name);
    const call = api(scheduler.url, key);
    const { desktop, wakeOp } = await awake(call);
    expect((await call('POST', `/v1/desktops/${desktop}/exec`, { command: 'mkdir -p /tmp/canto-fuzz' })).json.exit_code).toBe(0);
    expect((await call('PUT', `/v1/desktops/${desktop}/files/tmp/canto-fuzz/a.txt`, 'canto fuzz\n', { 'content-type': 'application/octet-stream' })).status).toBe(204);
    const processId = (await call('POST', `/v1/desktops/${desktop}/exec`, { command: 'true', detached: true })).json.process_id;
    expect((await call('POST', `/v1/desktops/${desktop}/ports`, { port: 8080 })).status).toBe(201);
    const webhook = await call('POST', '/v1/webhooks', { url: 'https://hooks.example.com/canto-fuzz', events: ['desktop.destroyed'] });
    expect(webhook.status, webhook.text).toBe(201);
    const spareKey = await call('POST', '/v1/keys', { name: 'fuzz spare' });
    expect(spareKey.status, spareKey.text).toBe(201);
    return { call, key, desktop, wakeOp, processId, webhook: webhook.json.id, spareKey: spareKey.json.id };
  }

  beforeAll(async () => {
    scheduler = await startTestScheduler({
      CANTO_INGRESS_BASE_URL: 'http://apps.fuzz.test',
      CANTO_INGRESS_LISTEN: '127.0.0.1:0',
      // `?wait=true` answers within the answer timeout, settled or not.
      CANTO_WAIT_CAP_MS: '5000',
      // Heartbeats no longer wait on the agent's file-system calls, and this run passes with the
      // default 2.25 s; the margin is for a CI machine whose two cores the whole suite shares (a
      // host read down answers 503 to every guest variant, which tests nothing).
      CANTO_HOST_DOWN_MS: '5000',
    });
    agent = await startSandboxAgent(scheduler.url);
    [a, b] = await Promise.all([org('fuzz-a'), org('fuzz-b')]);
    // A new desktop is hibernated once placed: hibernate needs one that is awake.
    for (const op of OWN_DESKTOP_OPS) {
      spares[op] = op === 'hibernateDesktop' ? (await awake(a.call)).desktop : (await a.call('POST', '/v1/desktops', { tier: 'small' })).json.id;
    }
    // Placed: a fork needs a source with a host, and the engine places new desktops in the
    // background (on a busy machine, after the fork's variants had all been refused with 409).
    await until(async () => {
      for (const op of OWN_DESKTOP_OPS.filter((o) => o !== 'hibernateDesktop')) {
        if ((await a.call('GET', `/v1/desktops/${spares[op]}`)).json.state !== 'hibernated') return false;
      }
      return true;
    }, 30_000, 'the spare desktops to be placed');
    const res = await fetch(`${scheduler.url}/v1/openapi.json`);
    expect(res.status).toBe(200);
    doc = await res.json();
  }, 120_000);

  afterAll(async () => {
    await agent?.stop();
    await scheduler?.close();
  });

  function targets(): Targets {
    return {
      key: a.key,
      body: (op) => BODIES[op.operationId],
      param(op: DocOperation, name: string) {
        const resource = /^\/v1\/([a-z]+)\//.exec(op.template)?.[1];
        if (name === 'id' && resource === 'desktops') return { own: spares[op.operationId] ?? a.desktop, other: b.desktop };
        if (name === 'id' && resource === 'operations') return { own: a.wakeOp, other: b.wakeOp };
        if (name === 'id' && resource === 'webhooks') return { own: a.webhook, other: b.webhook };
        if (name === 'id' && resource === 'keys') return { own: a.spareKey, other: b.spareKey };
        if (name === 'process_id') return { own: a.processId, other: b.processId };
        if (name === 'port') return { own: '8080' };
        if (name === 'path') return { own: op.operationId === 'listDirectory' ? 'tmp/canto-fuzz' : 'tmp/canto-fuzz/a.txt' };
        throw new Error(`the fuzz test has no target for parameter ${name} of ${opName(op)}: add one`);
      },
    };
  }

  /** Runs `variants` `CONCURRENCY` at a time; answers the findings. */
  async function run(variants: Variant[], context: CheckContext): Promise<Finding[]> {
    const findings: Finding[] = [];
    const client = fuzzClient(new URL(scheduler.url), CONCURRENCY);
    let next = 0;
    try {
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          while (next < variants.length) {
            const v = variants[next++]!;
            const answer = await client.send(v, ANSWER_TIMEOUT_MS);
            if (!('error' in answer) && answer.status < 300) reached.add(v.op.operationId);
            findings.push(...checkVariant(v, answer, context));
          }
        }),
      );
    } finally {
      client.close();
    }
    return findings;
  }

  it('answers every hostile variant of every documented operation as the contract says', async () => {
    const rng = seededRng(SEED);
    const operations = operationsOf(doc);
    expect(operations.length).toBeGreaterThan(30);
    const all = operations.flatMap((op) => variantsFor(op, targets(), rng));
    expect(all.length, 'requests in one run').toBeLessThanOrEqual(MAX_REQUESTS);
    // Deletions and destroy go last: the rest of the run still needs what they remove. Each
    // operation's variants go out together, in a seeded order, so that they also race each other
    // on the same desktop (two resizes at once, two inputs at once).
    const last = (op: DocOperation) => op.method === 'DELETE' || op.operationId === 'destroyDesktop';
    const batch = (ops: DocOperation[]) => ops.flatMap((op) => rng.shuffle(all.filter((v) => v.op === op)));
    const phases = [batch(operations.filter((op) => !last(op))), batch(operations.filter(last))];
    const context: CheckContext = {
      schemas: new DocumentSchemas(doc),
      leaks: { literals: [process.cwd(), agent.stateDir, scheduler.databaseUrl, b.key, a.key] },
      unstated: (op, detail) => UNSTATED_RULES.some(([id, pattern]) => id === op.operationId && pattern.test(detail)),
    };
    const t0 = performance.now();
    const findings: Finding[] = [];
    for (const phase of phases) findings.push(...(await run(phase, context)));
    console.info(`openapi fuzz: ${all.length} requests over ${operations.length} operations in ${Math.round(performance.now() - t0)} ms`);
    // Every operation was reached for real at least once, so the variants went past the front door.
    for (const op of operations.filter((o) => !reached.has(o.operationId))) {
      findings.push({ category: 'never answered 2xx: the test does not reach it', where: opName(op), family: '', label: '', status: '-', snippet: '' });
    }
    // The other org's things are untouched by everything sent with this org's key.
    const theirs = [
      ['desktop', `/v1/desktops/${b.desktop}`],
      ['port', `/v1/desktops/${b.desktop}/ports`],
      ['webhook', `/v1/webhooks/${b.webhook}/deliveries`],
      ['process', `/v1/desktops/${b.desktop}/processes/${b.processId}`],
    ] as const;
    for (const [what, path] of theirs) {
      const res = await b.call('GET', path);
      const changed = res.status !== 200 || (what === 'desktop' && res.json.state !== 'awake') || (what === 'port' && res.json.ports.length !== 1);
      if (changed) findings.push({ category: "the other org's things changed", where: what, family: what, label: what, status: res.status, snippet: res.text.slice(0, 200) });
    }
    if ((await b.call('GET', '/v1/keys')).json.keys?.some((k: { id: string }) => k.id === b.spareKey) === false) {
      findings.push({ category: "the other org's things changed", where: 'key', family: 'key', label: 'spare key revoked', status: '-', snippet: '' });
    }
    expect(findings.length === 0, formatFindings(findings)).toBe(true);
  }, 120_000);

  it('documents what the server enforces of request bodies: no unknown members', () => {
    const findings: string[] = [];
    const visit = (schema: any, where: string, op: DocOperation) => {
      if (typeof schema !== 'object' || schema === null) return;
      if (schema.properties && schema.additionalProperties !== false) findings.push(`${opName(op)}: ${where || 'body'} allows unknown members`);
      for (const [name, sub] of Object.entries<any>(schema.properties ?? {})) visit(sub, `${where}.${name}`.replace(/^\./, ''), op);
      for (const sub of [...(schema.anyOf ?? []), ...(schema.oneOf ?? []), schema.items]) visit(sub, where, op);
    };
    for (const op of operationsOf(doc)) if (op.body?.mediaType === 'application/json') visit(op.body.schema, '', op);
    expect(findings.length === 0, `${findings.length} findings:\n${findings.join('\n')}`).toBe(true);
  });

  it('answers malformed framing on a raw socket with problem+json, on the API and the ingress', async () => {
    const auth = `Authorization: Bearer ${a.key}\r\n`;
    const get = `GET /v1/desktops HTTP/1.1\r\nHost: x\r\n${auth}`;
    const post = `POST /v1/desktops HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\n`;
    const cases: Array<[string, string | Buffer, number[] | null]> = [
      ['duplicate Content-Length', `${post}Content-Length: 1\r\nContent-Length: 2\r\n\r\nab`, [400]],
      ['negative Content-Length', `${post}Content-Length: -1\r\n\r\n`, [400]],
      ['Content-Length 1e3', `${post}Content-Length: 1e3\r\n\r\n`, [400]],
      ['Content-Length and chunked', `${post}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`, [400]],
      ['bad chunk size', `${post}Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`, [400]],
      ['chunk size overflow', `${post}Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n{}\r\n`, [400, 413]],
      ['unknown transfer coding', `${post}Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n`, [400, 501]],
      ['NUL in a header', Buffer.from(`${get}X-Bad: a\u0000b\r\n\r\n`, 'latin1'), [400]],
      ['obs-fold', `${get}X-Fold: a\r\n b\r\n\r\n`, null],
      ['header without a colon', `${get}NoColon\r\n\r\n`, [400]],
      ['space before the colon', `${get}X-Space : 1\r\n\r\n`, [400]],
      ['20 KiB header', `${get}X-Big: ${'a'.repeat(20 * 1024)}\r\n\r\n`, [431]],
      ['100 KiB URL', `GET /v1/desktops/${'a'.repeat(100 * 1024)} HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, [400, 404, 414, 431]],
      ['no Host', `GET /v1/desktops HTTP/1.1\r\n${auth}\r\n`, [400]],
      ['Expect: junk', `${post}Expect: junk\r\nContent-Length: 2\r\n\r\n{}`, [417]],
      ['CONNECT', 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n', [405]],
      ['unknown method', `BREW /v1/desktops HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, [400, 405]],
      ['TRACE', `TRACE /v1/desktops HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, [404, 405]],
      ['garbage request line', 'GARBAGE\r\n\r\n', [400]],
      ['HTTP/2 preface', 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', [400, 505]],
      ['HTTP/9.9', `GET /v1/desktops HTTP/9.9\r\nHost: x\r\n${auth}\r\n`, [400, 505]],
      ['absolute-form target', `GET http://evil.example/v1/desktops HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, null],
      ['bare LF line ends', `GET /v1/desktops HTTP/1.1\nHost: x\n${auth.replace('\r\n', '\n')}\n`, null],
      ['raw NUL in the path', Buffer.from(`GET /v1/desktops/a\u0000b HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 'latin1'), [400]],
    ];
    const ingressCases = new Set(['duplicate Content-Length', 'bad chunk size', 'NUL in a header', '20 KiB header', 'no Host', 'Expect: junk', 'CONNECT', 'unknown method', 'garbage request line']);
    const leaks: LeakGuard = { literals: [process.cwd(), agent.stateDir, scheduler.databaseUrl, a.key] };
    const findings: Finding[] = [];
    const exchanges = cases.flatMap(([name, raw, expected]) => [
      { where: `API, ${name}`, base: scheduler.url, raw, expected },
      ...(ingressCases.has(name) ? [{ where: `ingress, ${name}`, base: scheduler.ingressUrl!, raw, expected }] : []),
    ]);
    await Promise.all(
      exchanges.map(async ({ where, base, raw, expected }) => {
        const answer = await rawExchange(base, raw);
        const add = (category: string, note = '') =>
          findings.push({ category, where, family: where, label: where, status: 'error' in answer ? '-' : answer.status, snippet: note || ('error' in answer ? answer.error : answer.body.toString('utf8', 0, 200)) });
        if ('error' in answer) return add('no answer');
        for (const [category, note] of problemFindings(answer, leaks)) add(category, note);
        if (expected && !expected.includes(answer.status)) add(`expected ${expected.join(' or ')}`);
      }),
    );
    expect(findings.length === 0, formatFindings(findings)).toBe(true);
  });
});
