/** GET /v1/usage (docs/api.md §4.9): awake seconds, desktop-months and projected cost over a range. */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { UsageResponse } from '../../api/schemas.js';

export function registerUsageRoutes(app: App, deps: AppDeps): void {
  app.get(
    '/v1/usage',
    {
      schema: {
        summary: 'Usage and projected cost',
        querystring: Type.Object({
          start: Type.Optional(Type.String({ description: 'Unix milliseconds; default end minus 30 days' })),
          end: Type.Optional(Type.String({ description: 'Unix milliseconds; default now' })),
        }),
        response: { 200: Type.Ref(UsageResponse), ...errorResponses(400) },
      },
    },
    async (request) => deps.usage.report(request.orgId, request.query),
  );
}
