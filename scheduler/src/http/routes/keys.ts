/**
 * API keys (docs/api.md §4.10, 5): create another key in the caller's org (its secret in this answer
 * only), list the org's keys (never a secret), revoke one (every replica refuses it from its next
 * request). A key id that cannot exist is simply not found, as for webhooks.
 */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { errors } from '../../errors.js';
import { ApiKeyJson, CreateApiKeyBody, CreatedApiKeyJson, KeyIdParams } from '../../api/schemas.js';

export function registerKeyRoutes(app: App, deps: AppDeps): void {
  app.post(
    '/v1/keys',
    {
      schema: {
        summary: "Create an API key in the caller's org; the key itself is in this response only",
        body: CreateApiKeyBody,
        response: { 201: Type.Ref(CreatedApiKeyJson), ...errorResponses(400, 413) },
      },
    },
    async (request, reply) => reply.code(201).send(await deps.keys.create(request.orgId, request.body.name ?? null)),
  );

  app.get(
    '/v1/keys',
    {
      schema: {
        summary: "List the org's live API keys (never their secrets)",
        response: { 200: Type.Object({ keys: Type.Array(Type.Ref(ApiKeyJson)) }), ...errorResponses() },
      },
    },
    async (request) => ({ keys: await deps.keys.list(request.orgId) }),
  );

  app.delete(
    '/v1/keys/:id',
    {
      attachValidation: true,
      schema: {
        summary: 'Revoke an API key: every replica refuses it from its next request',
        params: KeyIdParams,
        response: { 204: { description: 'Revoked', type: 'null' }, ...errorResponses(404) },
      },
    },
    async (request, reply) => {
      if (request.validationError) throw errors.keyNotFound();
      await deps.keys.revoke(request.orgId, request.params.id);
      return reply.code(204).send();
    },
  );
}
