/**
 * Probes and metrics for operators, outside the `/v1` contract and its OpenAPI document, with no
 * credential: `/healthz` says the process serves HTTP, `/readyz` that it can serve the API (its
 * database answers and carries every migration this build knows), `/metrics` is Prometheus text.
 * None of them names an org, a desktop or a secret.
 */
import type { App, AppDeps } from '../route-types.js';
import { problem } from '../../errors.js';

export function registerHealthRoutes(app: App, deps: AppDeps): void {
  const options = { config: { public: true }, schema: { hide: true } } as const;

  app.get('/healthz', options, async () => ({ status: 'ok' }));

  app.get('/readyz', options, async (_request, reply) => {
    const why = await deps.notReady();
    if (why === null) return { status: 'ready' };
    return reply.code(503).header('retry-after', '1').type('application/problem+json').send(problem(503, why));
  });

  app.get('/metrics', options, async (_request, reply) => {
    return reply.type(deps.metrics.contentType).send(await deps.metrics.text());
  });
}
