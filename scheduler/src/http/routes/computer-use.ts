/**
 * Computer use and streaming (docs/api.md §4.5, 4.6): screenshots, input batches and stream tickets of an
 * awake desktop. Each is one round trip to the desktop's agent, which captures, types or grants;
 * the scheduler validates, maps errors and shapes the answer. A stream ticket is only a promise
 * to the agent's stream gateway: the bytes of a stream never pass through the scheduler.
 */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { DesktopIdParams } from '../../api/schemas.js';
import type { ScreenRegion } from '../../../../shared/src/guest-commands.js';
import { InputBody, InputResponse, ScreenshotBody, StreamBody, StreamTicketResponse } from '../../api/guest-schemas.js';

const screenshotResponse = {
  description: 'The PNG (`encoding: binary`, the default), or JSON with the PNG in base64 (`encoding: base64`)',
  content: {
    'image/png': { schema: { type: 'string', format: 'binary' } },
    'application/json': { schema: { $ref: 'ScreenshotBase64Response#' } },
  },
};

/**
 * The region cut at the screen's top and left edges, which need no screen size; the agent cuts
 * it at the other two (agent/src/runtime/screen-geometry.ts). A region wholly before an edge
 * keeps the first row or column, as one wholly past the far edge keeps the last: never empty.
 */
function onScreenSide(region: ScreenRegion): ScreenRegion {
  const cut = (start: number, size: number): [number, number] => (start >= 0 ? [start, size] : [0, Math.max(1, start + size)]);
  const [x, width] = cut(region.x, region.width);
  const [y, height] = cut(region.y, region.height);
  return { x, y, width, height };
}

export function registerComputerUseRoutes(app: App, deps: AppDeps): void {
  app.post(
    '/v1/desktops/:id/screenshot',
    {
      schema: {
        summary: 'Capture the screen as PNG',
        description:
          'An empty body captures the whole display. `region` crops (clamped to the screen), `scale_percent` then ' +
          'downscales; width and height are those of the image returned. Over 8 MiB of PNG is 413.',
        params: DesktopIdParams,
        body: ScreenshotBody,
        response: { 200: screenshotResponse, ...errorResponses(400, 404, 409, 413, 501, 504) },
      },
    },
    async (request, reply) => {
      const body = request.body;
      const region = body.region ? onScreenSide(body.region) : null;
      const shot = await deps.guest.screenshot(request.orgId, request.params.id, region, body.scale_percent ?? null);
      if (body.encoding === 'base64') {
        return reply.type('application/json').send({ data_base64: shot.png.toString('base64'), width: shot.width, height: shot.height });
      }
      return reply.type('image/png').send(shot.png);
    },
  );

  app.post(
    '/v1/desktops/:id/input',
    {
      schema: {
        summary: 'Run a batch of mouse and keyboard actions, in order',
        description:
          'One guest round trip, not transactional: on a failure mid-batch (500) the earlier actions have run. ' +
          'Buttons are left, middle or right (default left); scroll directions up, down, left or right; ' +
          '`from` and `to` are {x, y}. At most 50 actions, 32 KiB of text and 10 s of waits per batch. ' +
          'An empty list only reads the cursor. Input is never gated by a stream control claim.',
        params: DesktopIdParams,
        body: InputBody,
        response: { 200: Type.Ref(InputResponse), ...errorResponses(400, 404, 409, 501, 504) },
      },
    },
    async (request) => deps.guest.input(request.orgId, request.params.id, request.body.actions),
  );

  app.post(
    '/v1/desktops/:id/stream',
    {
      schema: {
        summary: 'Get a single-use ticket for a live VNC stream of the display',
        description:
          'Dial the returned `tcp://host:port`, send the ticket followed by a newline, and speak RFB (VNC) from the ' +
          "server's greeting on; a refused ticket gets `ERR <reason>` and a close. Browsers open `ws_url` instead: the same " +
          'ticket as a WebSocket with RFB in binary frames (subprotocol `binary`, as noVNC offers); a refused ticket closes it ' +
          'with 4401 invalid_ticket, 4410 expired_ticket, 4409 not_running or 4503 unavailable. Tickets live 60 s and work once, by either URL. ' +
          'A `control` claim is held from the grant until its connection closes (or the unused ticket expires); ' +
          'meanwhile exec and file routes answer 409 and a second `control` claim is 409.',
        params: DesktopIdParams,
        body: StreamBody,
        response: { 201: Type.Ref(StreamTicketResponse), ...errorResponses(400, 404, 409, 501, 504) },
      },
    },
    async (request, reply) => {
      const ticket = await deps.guest.streamTicket(request.orgId, request.params.id, request.body.claim);
      return reply.code(201).send(ticket);
    },
  );
}
