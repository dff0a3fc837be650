/**
 * Port exposure routes (docs/api.md §4.7): list, create and delete the exposures of a desktop. The
 * exposed ports themselves are served by the ingress (scheduler/src/ingress/), not here.
 *
 * A malformed desktop id is 400 (docs/api.md §4's common rule); a port segment that cannot be an exposed
 * port is 404 on delete, like a port that simply is not exposed (the contract has no 400 there): the
 * service decides that, so the schema takes any segment.
 */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { CreatePortBody, DesktopIdParams, PortExposureJson, PortParams } from '../../api/schemas.js';

const noContent = { description: 'Deleted', type: 'null' };

export function registerPortRoutes(app: App, deps: AppDeps): void {
  app.get(
    '/v1/desktops/:id/ports',
    {
      schema: {
        summary: "List a desktop's port exposures (tokens are never listed)",
        params: DesktopIdParams,
        response: { 200: Type.Object({ ports: Type.Array(Type.Ref(PortExposureJson)) }), ...errorResponses(400, 404) },
      },
    },
    async (request) => ({ ports: await deps.ports.list(request.orgId, request.params.id) }),
  );

  app.post(
    '/v1/desktops/:id/ports',
    {
      schema: {
        summary: 'Expose a guest TCP port through the ingress; a private exposure\'s token is in this response only',
        description:
          'The desktop must be awake. A private exposure needs its token at the ingress, as query parameter ' +
          '`svc_token` or header `X-Svc-Token`; the ingress strips it before forwarding. To rotate a token, ' +
          'delete the exposure and create it again.',
        params: DesktopIdParams,
        body: CreatePortBody,
        response: { 201: Type.Ref(PortExposureJson), ...errorResponses(400, 404, 409, 413, 501) },
      },
    },
    async (request, reply) => reply.code(201).send(await deps.ports.create(request.orgId, request.params.id, request.body)),
  );

  app.delete(
    '/v1/desktops/:id/ports/:port',
    {
      schema: {
        summary: 'Delete a port exposure; its URL answers 404 from then on',
        params: PortParams,
        response: { 204: noContent, ...errorResponses(400, 404) },
      },
    },
    async (request, reply) => {
      await deps.ports.remove(request.orgId, request.params.id, request.params.port);
      return reply.code(204).send();
    },
  );
}
