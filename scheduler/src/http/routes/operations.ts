/** GET /v1/operations/{id} (docs/api.md §4.2). */
import { Type } from '@sinclair/typebox';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { toOperationJson } from '../../services/json.js';
import { OperationIdParams, OperationJson } from '../../api/schemas.js';

export function registerOperationRoutes(app: App, deps: AppDeps): void {
  app.get(
    '/v1/operations/:id',
    {
      schema: {
        summary: 'Get an operation',
        params: OperationIdParams,
        response: { 200: Type.Ref(OperationJson), ...errorResponses(400, 404) },
      },
    },
    async (request) => toOperationJson(await deps.lifecycle.get(request.orgId, request.params.id)),
  );
}
