/**
 * The OpenAPI 3.1 document (docs/api.md §1, 5): served without credentials, valid against the
 * OpenAPI 3.1 schema, with the `bearer_auth` scheme, every implemented route of docs/api.md §4.1, 4.2, 4.3,
 * 4.4, 4.7, 4.8 and 4.9, and problem+json error responses documented on each.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Validator } from '@seriousme/openapi-schema-validator';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';

let s: TestScheduler;
let doc: any;

beforeAll(async () => {
  s = await startTestScheduler();
  const res = await fetch(`${s.url}/v1/openapi.json`);
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^application\/json/);
  doc = await res.json();
});

afterAll(async () => {
  await s?.close();
});

/** Route → method → error statuses it must document (docs/api.md §4.1, 4.2, 4.9, 5, 7). */
const ROUTES: Record<string, Record<string, number[]>> = {
  '/v1/desktops': { get: [400, 401], post: [400, 401, 413] },
  '/v1/desktops/{id}': { get: [400, 401, 404], patch: [400, 401, 404] },
  '/v1/desktops/{id}/wake': { post: [400, 401, 404, 409, 503] },
  '/v1/desktops/{id}/hibernate': { post: [400, 401, 404, 409, 503] },
  '/v1/desktops/{id}/destroy': { post: [400, 401, 404, 409, 503] },
  '/v1/desktops/{id}/fork': { post: [400, 401, 404, 409, 413, 503] },
  '/v1/operations/{id}': { get: [400, 401, 404] },
  '/v1/usage': { get: [400, 401] },
  '/v1/desktops/{id}/exec': { post: [400, 401, 404, 409, 503, 504] },
  '/v1/desktops/{id}/processes/{process_id}': { get: [400, 401, 404, 409, 503] },
  '/v1/desktops/{id}/files/{path}': {
    get: [400, 401, 404, 409, 413, 503, 504],
    put: [400, 401, 404, 409, 413, 503, 504],
    delete: [400, 401, 404, 409, 503, 504],
  },
  '/v1/desktops/{id}/files-meta/{path}': { get: [400, 401, 404, 409, 503, 504] },
  '/v1/desktops/{id}/dir/{path}': { get: [400, 401, 404, 409, 503, 504] },
  '/v1/desktops/{id}/display': { get: [400, 401, 404, 409, 501, 503, 504], put: [400, 401, 404, 409, 501, 503, 504] },
  '/v1/desktops/{id}/screenshot': { post: [400, 401, 404, 409, 413, 500, 501, 503, 504] },
  '/v1/desktops/{id}/input': { post: [400, 401, 404, 409, 500, 501, 503, 504] },
  '/v1/desktops/{id}/stream': { post: [400, 401, 404, 409, 501, 503] },
  '/v1/desktops/{id}/ports': { get: [400, 401, 404], post: [400, 401, 404, 409, 501] },
  '/v1/desktops/{id}/ports/{port}': { delete: [400, 401, 404] },
  '/v1/webhooks': { get: [401], post: [400, 401] },
  '/v1/webhooks/{id}': { delete: [401, 404] },
  '/v1/webhooks/{id}/deliveries': { get: [400, 401, 404] },
};

const LIFECYCLE = ['/v1/desktops/{id}/wake', '/v1/desktops/{id}/hibernate', '/v1/desktops/{id}/destroy'];

describe('GET /v1/openapi.json', () => {
  it('is served without credentials, and with garbage credentials too', async () => {
    const res = await fetch(`${s.url}/v1/openapi.json`, { headers: { authorization: 'Bearer garbage' } });
    expect(res.status).toBe(200);
  });

  it('is a valid OpenAPI 3.1 document', async () => {
    expect(doc.openapi).toMatch(/^3\.1\.\d+$/);
    const result = await new Validator().validate(doc);
    if (!result.valid) console.error(JSON.stringify(result.errors, null, 2));
    expect(result.valid).toBe(true);
  });

  it('passes `redocly lint` with its recommended rules: no error and no warning', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'canto-openapi-'));
    try {
      writeFileSync(join(dir, 'openapi.json'), JSON.stringify(doc));
      // Exits non-zero on errors only; warnings are read from the JSON report.
      const run = await promisify(execFile)('node_modules/.bin/redocly', ['lint', join(dir, 'openapi.json'), '--format=json'], {
        maxBuffer: 16 * 1024 * 1024,
        env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' },
      }).catch((err: { stdout?: string }) => ({ stdout: err.stdout ?? '' }));
      const report = JSON.parse(run.stdout) as { totals: object; problems: Array<{ ruleId: string; message: string; location: Array<{ pointer: string }> }> };
      const problems = report.problems.map((p) => `${p.ruleId}: ${p.message} at ${p.location[0]?.pointer}`);
      expect(problems).toEqual([]);
      expect(report.totals).toMatchObject({ errors: 0, warnings: 0 });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('explains errors, retries and pagination, describes every tag, and shows an example of every JSON body', () => {
    expect(doc.info.description).toMatch(/problem\+json/);
    expect(doc.info.description).toMatch(/Retry-After/);
    expect(doc.info.description).toMatch(/not paginated/);
    for (const tag of doc.tags) expect(tag.description, tag.name).toBeTypeOf('string');
    for (const [path, item] of Object.entries<Record<string, any>>(doc.paths)) {
      for (const [method, op] of Object.entries<any>(item)) {
        const json = op.requestBody?.content?.['application/json'];
        if (json) expect(json.example, `${method} ${path}`).toBeDefined();
      }
    }
  });

  it('says request bodies are closed: unknown members are refused', () => {
    for (const [path, item] of Object.entries<Record<string, any>>(doc.paths)) {
      for (const [method, op] of Object.entries<any>(item)) {
        const schema = op.requestBody?.content?.['application/json']?.schema;
        if (schema) expect(schema.additionalProperties, `${method} ${path}`).toBe(false);
      }
    }
    for (const name of Object.keys(doc.components.schemas).filter((n) => n.startsWith('InputAction_'))) {
      expect(doc.components.schemas[name].additionalProperties, name).toBe(false);
    }
  });

  it('declares the bearer_auth scheme and requires it by default', () => {
    expect(doc.components.securitySchemes.bearer_auth).toMatchObject({ type: 'http', scheme: 'bearer' });
    expect(doc.security).toEqual([{ bearer_auth: [] }]);
  });

  it.each(Object.entries(ROUTES))('documents %s', (path, methods) => {
    const item = doc.paths[path];
    expect(item, `missing path ${path}`).toBeDefined();
    for (const [method, statuses] of Object.entries(methods)) {
      const op = item[method];
      expect(op, `missing ${method.toUpperCase()} ${path}`).toBeDefined();
      // Not opted out of the document-wide bearer_auth requirement.
      expect(op.security === undefined || op.security.some((r: object) => 'bearer_auth' in r)).toBe(true);
      for (const status of statuses) {
        const response = op.responses[String(status)];
        expect(response, `${method.toUpperCase()} ${path} does not document ${status}`).toBeDefined();
        expect(Object.keys(response.content ?? {}), `${method.toUpperCase()} ${path} ${status}`).toContain('application/problem+json');
      }
      if (path.includes('{id}')) {
        const id = (op.parameters ?? []).find((p: { in: string; name: string }) => p.in === 'path' && p.name === 'id');
        expect(id, `${path} id parameter`).toMatchObject({ required: true });
        expect(id.schema.pattern).toBeTypeOf('string');
      }
    }
  });

  it('documents the success responses with their schemas', () => {
    const ref = (op: any, status: number) => JSON.stringify(op.responses[String(status)].content['application/json'].schema);
    expect(ref(doc.paths['/v1/desktops'].post, 201)).toContain('DesktopJson');
    expect(ref(doc.paths['/v1/desktops'].post, 200)).toContain('DesktopJson');
    expect(ref(doc.paths['/v1/desktops/{id}'].get, 200)).toContain('DesktopJson');
    expect(ref(doc.paths['/v1/operations/{id}'].get, 200)).toContain('OperationJson');
    expect(ref(doc.paths['/v1/usage'].get, 200)).toContain('UsageResponse');
    for (const path of LIFECYCLE) {
      expect(ref(doc.paths[path].post, 202)).toContain('OperationJson');
      expect(ref(doc.paths[path].post, 200)).toContain('OperationJson');
    }
  });

  it('documents the guest routes: binary file bodies, the documented path parameter, process and file records', () => {
    const ref = (op: any, status: number) => JSON.stringify(op.responses[String(status)].content['application/json'].schema);
    const files = doc.paths['/v1/desktops/{id}/files/{path}'];
    expect(files.put.requestBody.content['application/octet-stream'].schema).toMatchObject({ type: 'string', format: 'binary' });
    expect(files.get.responses['200'].content['application/octet-stream']).toBeDefined();
    expect(files.get.responses['200'].headers['X-Svc-Eof']).toBeDefined();
    expect(files.get.parameters.map((p: { name: string }) => p.name)).toEqual(expect.arrayContaining(['path', 'offset', 'length']));
    expect(ref(doc.paths['/v1/desktops/{id}/exec'].post, 200)).toContain('ExecResponse');
    expect(ref(doc.paths['/v1/desktops/{id}/exec'].post, 202)).toContain('ExecDetachedResponse');
    expect(ref(doc.paths['/v1/desktops/{id}/processes/{process_id}'].get, 200)).toContain('ProcessStatusResponse');
    expect(ref(doc.paths['/v1/desktops/{id}/files-meta/{path}'].get, 200)).toContain('FileStatJson');
    expect(ref(doc.paths['/v1/desktops/{id}/dir/{path}'].get, 200)).toContain('ListDirResponse');
    const stat = doc.components.schemas.FileStatJson;
    expect(Object.keys(stat.properties).sort()).toEqual(['fileType', 'mode', 'modifiedAt', 'path', 'sizeBytes']);
  });

  it('documents wait, Idempotency-Key and the optional body on lifecycle routes', () => {
    for (const path of LIFECYCLE) {
      const op = doc.paths[path].post;
      const names = op.parameters.map((p: { in: string; name: string }) => `${p.in}:${p.name.toLowerCase()}`);
      expect(names).toEqual(expect.arrayContaining(['query:wait', 'header:idempotency-key']));
      // docs/api.md §2.4: the body is optional; an empty one equals {}.
      expect(op.requestBody?.required ?? false, `${path} requestBody.required`).toBe(false);
    }
    expect(doc.paths['/v1/desktops/{id}'].patch.requestBody?.required ?? false).toBe(false);
    const createParams = doc.paths['/v1/desktops'].post.parameters.map((p: { name: string }) => p.name.toLowerCase());
    expect(createParams).toContain('idempotency-key');
  });

  it('documents the webhook records with the documented fields, the secret optional', () => {
    const ref = (op: any, status: number) => JSON.stringify(op.responses[String(status)].content['application/json'].schema);
    expect(ref(doc.paths['/v1/webhooks'].post, 201)).toContain('WebhookEndpoint');
    expect(ref(doc.paths['/v1/webhooks'].get, 200)).toContain('WebhookEndpoint');
    expect(ref(doc.paths['/v1/webhooks/{id}/deliveries'].get, 200)).toContain('WebhookDelivery');
    const { WebhookEndpoint, WebhookDelivery } = doc.components.schemas;
    expect(Object.keys(WebhookEndpoint.properties).sort()).toEqual(['createdAt', 'events', 'id', 'secret', 'url']);
    expect(WebhookEndpoint.required).not.toContain('secret');
    expect(Object.keys(WebhookDelivery.properties).sort()).toEqual(
      ['attempts', 'createdAt', 'deliveredAt', 'eventType', 'id', 'lastError', 'lastStatus', 'nextAttemptAt', 'payload', 'state'],
    );
    const body = doc.paths['/v1/webhooks'].post.requestBody.content['application/json'].schema;
    expect(body.required).toEqual(expect.arrayContaining(['url', 'events']));
    expect(body.properties.url.maxLength).toBe(2000);
    expect(body.properties.events.items.enum).toEqual(['desktop.created', 'desktop.woken', 'desktop.hibernated', 'desktop.destroyed']);
    const limit = doc.paths['/v1/webhooks/{id}/deliveries'].get.parameters.find((p: { name: string }) => p.name === 'limit');
    expect(limit).toMatchObject({ in: 'query' });
  });

  it('documents the port exposure records with the documented fields, the token optional', () => {
    const ref = (op: any, status: number) => JSON.stringify(op.responses[String(status)].content['application/json'].schema);
    expect(ref(doc.paths['/v1/desktops/{id}/ports'].post, 201)).toContain('PortExposure');
    expect(ref(doc.paths['/v1/desktops/{id}/ports'].get, 200)).toContain('PortExposure');
    const { PortExposure } = doc.components.schemas;
    expect(Object.keys(PortExposure.properties).sort()).toEqual(['created_at', 'id', 'port', 'public', 'status', 'token', 'url']);
    expect(PortExposure.required).not.toContain('token');
    const body = doc.paths['/v1/desktops/{id}/ports'].post.requestBody.content['application/json'].schema;
    expect(body.required).toEqual(['port']);
    expect(body.properties.port).toMatchObject({ type: 'integer', minimum: 1, maximum: 65535 });
    expect(body.properties.public).toMatchObject({ type: 'boolean', default: false });
    const port = doc.paths['/v1/desktops/{id}/ports/{port}'].delete.parameters.find((p: { name: string }) => p.name === 'port');
    expect(port).toMatchObject({ in: 'path', required: true });
  });

  it('has Problem, DesktopJson and OperationJson with the documented fields', () => {
    const { Problem, DesktopJson, OperationJson } = doc.components.schemas;
    expect(Problem.required).toEqual(expect.arrayContaining(['type', 'title', 'status', 'detail']));
    expect(Object.keys(DesktopJson.properties)).toEqual(
      expect.arrayContaining(['id', 'org_id', 'tier', 'state', 'image_version', 'generation', 'current_generation_id', 'idle_timeout_secs', 'billing_mode', 'host_id']),
    );
    expect(DesktopJson.properties).not.toHaveProperty('env');
    expect(DesktopJson.properties).not.toHaveProperty('setup_script');
    expect(Object.keys(OperationJson.properties)).toEqual(expect.arrayContaining(['id', 'desktop_id', 'kind', 'state', 'result', 'error']));
  });

  it('lists the document itself as needing no credential, and no internal routes', () => {
    expect(doc.paths['/v1/openapi.json'].get.security).toEqual([]);
    expect(Object.keys(doc.paths).every((p) => p.startsWith('/v1/'))).toBe(true);
  });

  it('names every operation once, tags it with a declared tag, and says where the server is', () => {
    const declared = new Set(doc.tags.map((t: { name: string }) => t.name));
    const ids: string[] = [];
    for (const [path, item] of Object.entries<Record<string, { operationId?: string; tags?: string[] }>>(doc.paths)) {
      for (const [method, op] of Object.entries(item)) {
        expect(op.operationId, `${method} ${path}`).toMatch(/^[a-z][A-Za-z]+$/);
        expect(op.tags, `${method} ${path}`).toHaveLength(1);
        expect(declared.has(op.tags![0]), `${method} ${path}: ${op.tags![0]}`).toBe(true);
        ids.push(op.operationId!);
      }
    }
    expect(new Set(ids).size).toBe(ids.length);
    expect(doc.servers).toEqual([expect.objectContaining({ url: '/' })]);
  });

  it('documents Retry-After on every 503, and response headers with their schema once', () => {
    for (const [path, item] of Object.entries<Record<string, { responses: Record<string, { headers?: Record<string, { schema: Record<string, unknown> }> }> }>>(doc.paths)) {
      for (const [method, op] of Object.entries(item)) {
        const unavailable = op.responses['503'];
        if (!unavailable) continue;
        expect(unavailable.headers?.['Retry-After']?.schema, `${method} ${path}`).toEqual({ type: 'integer', minimum: 0 });
      }
    }
    const read = doc.paths['/v1/desktops/{id}/files/{path}'].get.responses['200'].headers;
    expect(read['X-Svc-File-Size'].schema).toEqual({ type: 'integer', minimum: 0 });
    expect(read['X-Svc-Eof'].schema).toEqual({ type: 'string', enum: ['true', 'false'] });
  });

  it('says what the server enforces of env keys', () => {
    const env = doc.paths['/v1/desktops'].post.requestBody.content['application/json'].schema.properties.env;
    expect(env.propertyNames).toEqual({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' });
    expect(env.maxProperties).toBe(100);
  });
});
