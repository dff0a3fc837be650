/**
 * The SDK's generated types come from the OpenAPI documents the scheduler serves, never from a
 * copy written by hand. Both documents are built here without a database: the Fastify app is
 * assembled with services that are never called (building routes and their schemas needs none)
 * and asked for `/v1/openapi.json` and `/admin/v1/openapi.json` through `inject`. The drift test
 * (test/integration/sdk-drift.test.ts) fetches the same documents from a real scheduler and
 * renders them with `renderTypes`, so a difference either way fails CI.
 */
import openapiTS, { astToString, COMMENT_HEADER, type OpenAPI3 } from 'openapi-typescript';
import { buildApp, type AppDeps } from '../scheduler/src/http/app.js';
import { registerAdminApi, type AdminApiDeps } from '../scheduler/src/admin/routes.js';
import { SchedulerMetrics } from '../scheduler/src/observability/metrics.js';
import { silentLogger } from '../shared/src/log.js';

/** Where each generated file lives, relative to the repository root, and which document it types. */
export const GENERATED = [
  { file: 'sdk/src/generated/api.ts', document: '/v1/openapi.json' },
  { file: 'sdk/src/generated/admin.ts', document: '/admin/v1/openapi.json' },
] as const;

export const REGENERATE_COMMAND = 'npm run sdk:generate';

/** The served documents, keyed by their path, from an app that has no database behind it. */
export async function buildDocuments(): Promise<Record<string, OpenAPI3>> {
  const unused = new Proxy({}, { get: () => () => Promise.reject(new Error('no service while generating the SDK')) });
  const logger = silentLogger();
  const app = await buildApp({
    logger,
    authenticate: async () => 'org_unused',
    metrics: new SchedulerMetrics(),
    notReady: async () => null,
    waitCapMs: 1000,
    desktops: unused, lifecycle: unused, waiter: unused, usage: unused, guest: unused, webhooks: unused, ports: unused, keys: unused,
  } as unknown as AppDeps);
  await registerAdminApi(app, { service: unused, moves: unused, token: null, logger } as unknown as AdminApiDeps);
  try {
    const out: Record<string, OpenAPI3> = {};
    for (const { document } of GENERATED) {
      const res = await app.inject({ method: 'GET', url: document });
      if (res.statusCode !== 200) throw new Error(`GET ${document} answered ${res.statusCode}`);
      out[document] = res.json() as OpenAPI3;
    }
    return out;
  } finally {
    await app.close();
  }
}

/** The TypeScript source openapi-typescript makes of `document`, exactly as committed. */
export async function renderTypes(document: OpenAPI3, servedAt: string): Promise<string> {
  // A deep copy: openapi-typescript annotates the object it is given.
  const ast = await openapiTS(structuredClone(document), { silent: true, alphabetize: true });
  const note = `// Generated from GET ${servedAt} by \`${REGENERATE_COMMAND}\`; the drift test fails when it is stale.\n\n`;
  return COMMENT_HEADER + note + astToString(ast);
}
