/** Display geometry of an awake desktop (docs/api.md §4.5): read live, or resized and read back. */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { DesktopIdParams } from '../../api/schemas.js';
import { DisplayBody, DisplayResponse } from '../../api/guest-schemas.js';

export function registerDisplayRoutes(app: App, deps: AppDeps): void {
  app.get(
    '/v1/desktops/:id/display',
    {
      schema: {
        summary: "The display's current geometry, read live from the guest",
        params: DesktopIdParams,
        response: { 200: Type.Ref(DisplayResponse), ...errorResponses(400, 404, 409, 501, 504) },
      },
    },
    async (request) => deps.guest.getDisplay(request.orgId, request.params.id),
  );

  app.put(
    '/v1/desktops/:id/display',
    {
      schema: {
        summary: 'Resize the display (640-2560 x 480-1600); answers the geometry read back',
        description: 'The geometry survives hibernate and wake (it is part of the memory snapshot); a cold boot starts at 1024x768.',
        params: DesktopIdParams,
        body: DisplayBody,
        response: { 200: Type.Ref(DisplayResponse), ...errorResponses(400, 404, 409, 501, 504) },
      },
    },
    async (request) => deps.guest.setDisplay(request.orgId, request.params.id, request.body.width, request.body.height),
  );
}
