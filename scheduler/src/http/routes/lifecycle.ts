/**
 * wake, hibernate, destroy (docs/api.md §4.1): each records a durable operation and answers 202 at once,
 * or with `?wait=true` as soon as the operation settles (200), a failure being 409 with the
 * operation's id, and the in-progress operation once the wait cap runs out (200).
 */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { errors } from '../../errors.js';
import { toOperationJson } from '../../services/json.js';
import type { LifecycleKind } from '../../services/lifecycle.js';
import { DesktopIdParams, ForkBody, IdempotencyHeaders, MutationBody, OperationJson, WaitQuery } from '../../api/schemas.js';
import { idempotencyKey } from './desktops.js';

const isSettled = (state: string) => state === 'succeeded' || state === 'failed';

export function registerLifecycleRoutes(app: App, deps: AppDeps): void {
  for (const kind of ['wake', 'hibernate', 'destroy'] as const satisfies readonly LifecycleKind[]) {
    app.post(
      `/v1/desktops/:id/${kind}`,
      {
        schema: {
          summary: `${kind[0]!.toUpperCase()}${kind.slice(1)} a desktop`,
          params: DesktopIdParams,
          querystring: WaitQuery,
          headers: IdempotencyHeaders,
          body: MutationBody,
          response: {
            200: Type.Ref(OperationJson),
            202: Type.Ref(OperationJson),
            ...errorResponses(400, 404, 409, 413, 503),
          },
        },
      },
      async (request, reply) => {
        const key = idempotencyKey(request.headers['idempotency-key']);
        const { op, repeated } = await deps.lifecycle.request(request.orgId, request.params.id, kind, {
          expectedGeneration: request.body.expected_generation ?? null,
          idempotencyKey: key,
        });
        if (!repeated && op.state === 'failed') throw errors.staleGeneration(op.id);
        if (request.query.wait !== 'true') {
          return reply.code(isSettled(op.state) ? 200 : 202).send(toOperationJson(op));
        }
        const settled = await deps.waiter.wait(request.orgId, op.id, deps.waitCapMs, op);
        if (settled.state === 'failed') throw errors.operationFailed(settled.id, settled.error?.message ?? 'failed');
        return reply.code(200).send(toOperationJson(settled));
      },
    );
  }

  app.post(
    '/v1/desktops/:id/fork',
    {
      schema: {
        summary: 'Fork a hibernated desktop into independent copies',
        description:
          'Each fork is an independent copy of the source\'s disk and memory snapshot, placed on the source\'s host and left ' +
          'hibernated. Forks inherit tier, billing mode, image and idle timeout; ephemeral forks get a 900 s idle timeout and ' +
          'are destroyed at it. On success the operation\'s result is {desktop_ids}. Without free storage slots on the host ' +
          'the operation fails with code no_capacity (413 with ?wait=true). 409 when the forks would exceed the org\'s desktop quota.',
        params: DesktopIdParams,
        querystring: WaitQuery,
        headers: IdempotencyHeaders,
        body: ForkBody,
        response: { 200: Type.Ref(OperationJson), 202: Type.Ref(OperationJson), ...errorResponses(400, 404, 409, 413, 501) },
      },
    },
    async (request, reply) => {
      const { op } = await deps.lifecycle.requestFork(request.orgId, request.params.id, {
        count: request.body.count,
        ephemeral: request.body.ephemeral ?? false,
        idempotencyKey: idempotencyKey(request.headers['idempotency-key']),
      });
      if (request.query.wait !== 'true') {
        return reply.code(isSettled(op.state) ? 200 : 202).send(toOperationJson(op));
      }
      const settled = isSettled(op.state) ? op : await deps.waiter.wait(request.orgId, op.id, deps.waitCapMs, op);
      if (settled.state === 'failed') {
        const message = settled.error?.message ?? 'failed';
        if (settled.error?.code === 'no_capacity') throw errors.noCapacity(settled.id, message);
        throw errors.operationFailed(settled.id, message);
      }
      return reply.code(200).send(toOperationJson(settled));
    },
  );
}
