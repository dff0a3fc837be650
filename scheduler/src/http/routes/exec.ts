/** Exec and detached processes (docs/api.md §4.3). */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { errors } from '../../errors.js';
import { clampTailBytes } from '../../services/guest.js';
import { DesktopIdParams } from '../../api/schemas.js';
import { ExecBody, ExecDetachedResponse, ExecResponse, ProcessParams, ProcessQuery, ProcessStatusResponse } from '../../api/guest-schemas.js';

export function registerExecRoutes(app: App, deps: AppDeps): void {
  app.post(
    '/v1/desktops/:id/exec',
    {
      schema: {
        summary: 'Run a command in an awake desktop (synchronously, or detached)',
        description:
          'Runs `/bin/sh -c command` as root inside the desktop with /root/.canto/env applied. ' +
          'Synchronous runs return at most 1 MiB of each output stream (the flags say when more was dropped) ' +
          'and answer 504 when timeout_secs passes. Detached runs answer 202 with a process_id at once.',
        params: DesktopIdParams,
        body: ExecBody,
        response: {
          200: Type.Ref(ExecResponse),
          202: Type.Ref(ExecDetachedResponse),
          ...errorResponses(400, 404, 409, 504),
        },
      },
    },
    async (request, reply) => {
      const { command, detached, timeout_secs } = request.body;
      if (command.trim() === '') throw errors.badRequest('command is empty');
      if (detached === true) {
        return reply.code(202).send(await deps.guest.spawn(request.orgId, request.params.id, command));
      }
      return reply.code(200).send(await deps.guest.exec(request.orgId, request.params.id, { command, timeoutSecs: timeout_secs }));
    },
  );

  app.get(
    '/v1/desktops/:id/processes/:process_id',
    {
      schema: {
        summary: 'Status and output tails of a detached process',
        description:
          '`lost` means the process is gone without a known exit code: detached processes are killed when ' +
          'the desktop hibernates and do not resume on wake. `setup` is the first-boot setup script.',
        params: ProcessParams,
        querystring: ProcessQuery,
        response: { 200: Type.Ref(ProcessStatusResponse), ...errorResponses(400, 404, 409, 504) },
      },
    },
    async (request) => {
      const raw = request.query.tail_bytes;
      const tailBytes = clampTailBytes(raw === undefined ? undefined : Number(raw));
      return deps.guest.processStatus(request.orgId, request.params.id, request.params.process_id, tailBytes);
    },
  );
}
