/**
 * Webhook routes (docs/api.md §4.8): register, list and delete endpoints, and read an endpoint's
 * delivery log.
 *
 * The id routes document the id pattern but answer 404, not 400, for an id that does not match
 * it: the contract has no 400 for the id on these routes, and an id that cannot exist is simply not
 * found (the same answer a missing or other-org endpoint gets).
 */
import { Type } from '@sinclair/typebox';
import type { FastifyRequest } from 'fastify';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { errors } from '../../errors.js';
import { DELIVERIES_MAX_LIMIT } from '../../services/webhooks.js';
import { CreateWebhookBody, DeliveriesQuery, WebhookDeliveryJson, WebhookEndpointJson, WebhookIdParams } from '../../api/schemas.js';

const noContent = { description: 'Deleted', type: 'null' };

/** Turns a validation failure held back by `attachValidation` into the route's answer. */
function rejectInvalid(request: FastifyRequest): void {
  const failure = request.validationError as (Error & { validationContext?: string }) | undefined;
  if (!failure) return;
  if (failure.validationContext === 'params') throw errors.webhookNotFound();
  throw errors.badRequest(`limit must be an integer from 1 to ${DELIVERIES_MAX_LIMIT}`);
}

export function registerWebhookRoutes(app: App, deps: AppDeps): void {
  app.get(
    '/v1/webhooks',
    {
      schema: {
        summary: "List the org's webhook endpoints (secrets are never listed)",
        response: { 200: Type.Object({ webhooks: Type.Array(Type.Ref(WebhookEndpointJson)) }), ...errorResponses() },
      },
    },
    async (request) => ({ webhooks: await deps.webhooks.list(request.orgId) }),
  );

  app.post(
    '/v1/webhooks',
    {
      schema: {
        summary: 'Register a webhook endpoint; the response carries its signing secret, shown only this once',
        body: CreateWebhookBody,
        response: { 201: Type.Ref(WebhookEndpointJson), ...errorResponses(400, 413) },
      },
    },
    async (request, reply) => reply.code(201).send(await deps.webhooks.create(request.orgId, request.body)),
  );

  app.delete(
    '/v1/webhooks/:id',
    {
      attachValidation: true,
      schema: {
        summary: 'Delete a webhook endpoint and its delivery log; pending deliveries stop',
        params: WebhookIdParams,
        response: { 204: noContent, ...errorResponses(404) },
      },
    },
    async (request, reply) => {
      rejectInvalid(request);
      await deps.webhooks.remove(request.orgId, request.params.id);
      return reply.code(204).send();
    },
  );

  app.get(
    '/v1/webhooks/:id/deliveries',
    {
      attachValidation: true,
      schema: {
        summary: "An endpoint's delivery log, newest first",
        params: WebhookIdParams,
        querystring: DeliveriesQuery,
        response: { 200: Type.Object({ deliveries: Type.Array(Type.Ref(WebhookDeliveryJson)) }), ...errorResponses(400, 404) },
      },
    },
    async (request) => {
      rejectInvalid(request);
      return { deliveries: await deps.webhooks.deliveries(request.orgId, request.params.id, request.query.limit) };
    },
  );
}
