/** Routes of docs/api.md §4.1 that read and write desktop records: list, create, get, patch. */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { errors } from '../../errors.js';
import {
  CreateDesktopBody,
  DesktopIdParams,
  DesktopJson,
  DesktopStateSchema,
  IdempotencyHeaders,
  UpdateDesktopBody,
} from '../../api/schemas.js';

export function idempotencyKey(value: string | undefined): string | null {
  if (value === undefined) return null;
  // Printable ASCII only (docs/api.md §4.11): anything else is rejected rather than silently normalized.
  if (!/^[\x20-\x7e]+$/.test(value)) throw errors.badRequest('Idempotency-Key must be printable ASCII');
  return value;
}

export function registerDesktopRoutes(app: App, deps: AppDeps): void {
  app.get(
    '/v1/desktops',
    {
      schema: {
        summary: 'List desktops',
        querystring: Type.Object({ state: Type.Optional(DesktopStateSchema) }),
        response: { 200: Type.Object({ desktops: Type.Array(Type.Ref(DesktopJson)) }), ...errorResponses(400) },
      },
    },
    async (request, reply) => {
      // Rendered by the route's own serializer, so a kept body is byte for byte what it would
      // write; Fastify sends a Buffer as it is, which the schema's type cannot say.
      const render = (desktops: DesktopJson[]) => reply.serialize({ desktops }) as string;
      const body = await deps.desktops.listBody(request.orgId, request.query.state ?? null, render);
      return reply.header('content-type', 'application/json; charset=utf-8').send(body as unknown as { desktops: DesktopJson[] });
    },
  );

  app.post(
    '/v1/desktops',
    {
      schema: {
        summary: 'Create a desktop',
        description: "409 when the org's desktop quota would be exceeded (desktops not destroyed, and forks asked for, count).",
        headers: IdempotencyHeaders,
        body: CreateDesktopBody,
        response: { 200: Type.Ref(DesktopJson), 201: Type.Ref(DesktopJson), ...errorResponses(400, 409, 413) },
      },
    },
    async (request, reply) => {
      const key = idempotencyKey(request.headers['idempotency-key']);
      const { created, desktop } = await deps.desktops.create(request.orgId, request.body, key);
      return reply.code(created ? 201 : 200).send(desktop);
    },
  );

  app.get(
    '/v1/desktops/:id',
    {
      schema: {
        summary: 'Get a desktop',
        params: DesktopIdParams,
        response: { 200: Type.Ref(DesktopJson), ...errorResponses(400, 404) },
      },
    },
    async (request) => deps.desktops.get(request.orgId, request.params.id),
  );

  app.patch(
    '/v1/desktops/:id',
    {
      schema: {
        summary: 'Update a desktop',
        params: DesktopIdParams,
        body: UpdateDesktopBody,
        response: { 200: Type.Ref(DesktopJson), ...errorResponses(400, 404, 413) },
      },
    },
    async (request) => deps.desktops.patch(request.orgId, request.params.id, request.body),
  );
}
