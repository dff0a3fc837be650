/**
 * The admin API's routes for desktops of every org (admin/desktops.ts), moving them and draining
 * hosts (admin/moves.ts), and reading any operation with a move's progress. Registered in the admin context (admin/routes.ts), so the
 * admin token guards them and they appear in the admin document only.
 */
import { Type } from '@sinclair/typebox';
import type { Logger } from '../../../shared/src/log.js';
import { idPattern } from '../../../shared/src/ids.js';
import type { App } from '../http/route-types.js';
import { errorResponses } from '../http/error-responses.js';
import { AdminOperationJson, DEFAULT_DRAIN_PARALLEL, type MoveService } from './moves.js';
import { AdminDesktopJson, AdminDesktopPage, AdminDesktopQuery, type AdminDesktops } from './desktops.js';
import { AdminHostJson, HostIdParams } from './schemas.js';
import type { AdminService } from './service.js';

const MOVES = ['Moves and drains'];
const DESKTOPS = ['Desktops'];
const DesktopIdParams = Type.Object({ desktop_id: Type.String({ pattern: idPattern('desktop'), description: '`dsk_…`, of any org' }) });

export function registerMoveRoutes(admin: App, moves: MoveService, hosts: AdminService, desktops: AdminDesktops, log: Logger): void {
  admin.get(
    '/admin/v1/desktops',
    {
      schema: {
        summary: 'List desktops of every org, in id order, a page at a time: where each is, its state, and the operation at work on it',
        operationId: 'listAdminDesktops',
        tags: DESKTOPS,
        querystring: AdminDesktopQuery,
        response: { 200: AdminDesktopPage, ...errorResponses(400) },
      },
    },
    async (request) => desktops.list(request.query),
  );

  admin.get(
    '/admin/v1/desktops/:desktop_id',
    {
      schema: {
        summary: 'Show one desktop of any org',
        operationId: 'getAdminDesktop',
        tags: DESKTOPS,
        params: DesktopIdParams,
        response: { 200: AdminDesktopJson, ...errorResponses(400, 404) },
      },
    },
    async (request) => desktops.get(request.params.desktop_id),
  );

  admin.post(
    '/admin/v1/desktops/:desktop_id/move',
    {
      schema: {
        summary: 'Move a desktop to another host: files, memory snapshot and (for an awake one) its running programs go with it',
        operationId: 'moveDesktop',
        tags: MOVES,
        params: DesktopIdParams,
        body: Type.Object(
          { host_id: Type.Optional(Type.Union([Type.String({ pattern: idPattern('host') }), Type.Null()], { description: 'The target; omitted or null: placement chooses' })) },
          { additionalProperties: false },
        ),
        response: { 202: AdminOperationJson, ...errorResponses(400, 404, 409) },
      },
    },
    async (request, reply) => {
      const op = await moves.move(request.params.desktop_id, request.body.host_id ?? null);
      log.info({ desktopId: op.desktop_id, operationId: op.id, hostId: request.body.host_id ?? null }, 'desktop move requested');
      return reply.code(202).send(op);
    },
  );

  admin.post(
    '/admin/v1/hosts/:host_id/drain',
    {
      schema: {
        summary: 'Drain a host: cordon it and move every desktop off, `parallel` at a time; refused (409, nothing changed) when the other hosts lack room or the host is down. Asking again resumes a stopped drain',
        operationId: 'drainHost',
        tags: MOVES,
        params: HostIdParams,
        body: Type.Object(
          { parallel: Type.Optional(Type.Integer({ minimum: 1, maximum: 32, description: `Moves at a time; default ${DEFAULT_DRAIN_PARALLEL}, or, asked again while a drain is under way or stopped, what that drain had` })) },
          { additionalProperties: false },
        ),
        response: { 202: AdminHostJson, ...errorResponses(400, 404, 409) },
      },
    },
    async (request, reply) => {
      const host = await moves.drain(request.params.host_id, request.body.parallel ?? null);
      log.info({ hostId: host.id, parallel: host.drain_parallel }, 'host drain requested');
      return reply.code(202).send(await hosts.getHost(host.id));
    },
  );

  admin.get(
    '/admin/v1/operations/:operation_id',
    {
      schema: {
        summary: 'Read an operation of any org; a move shows its phase, hosts and bytes',
        operationId: 'getAdminOperation',
        tags: MOVES,
        params: Type.Object({ operation_id: Type.String({ pattern: idPattern('operation') }) }),
        response: { 200: AdminOperationJson, ...errorResponses(400, 404) },
      },
    },
    async (request) => moves.operation(request.params.operation_id),
  );
}
