/**
 * How each route is named in the OpenAPI document: an `operationId` (what generated clients call
 * the method) and a tag (how documentation groups it), in one table, so a new route without a name
 * fails the document test rather than shipping as `post_v1_desktops_id_wake`. Also what every 503
 * says about `Retry-After`.
 */

/** `METHOD path` (Fastify's path syntax) → operation id and tag. */
export const OPERATIONS: Readonly<Record<string, { readonly operationId: string; readonly tag: string }>> = {
  'GET /v1/openapi.json': { operationId: 'getOpenApiDocument', tag: 'Meta' },
  'GET /v1/desktops': { operationId: 'listDesktops', tag: 'Desktops' },
  'POST /v1/desktops': { operationId: 'createDesktop', tag: 'Desktops' },
  'GET /v1/desktops/:id': { operationId: 'getDesktop', tag: 'Desktops' },
  'PATCH /v1/desktops/:id': { operationId: 'updateDesktop', tag: 'Desktops' },
  'POST /v1/desktops/:id/wake': { operationId: 'wakeDesktop', tag: 'Lifecycle' },
  'POST /v1/desktops/:id/hibernate': { operationId: 'hibernateDesktop', tag: 'Lifecycle' },
  'POST /v1/desktops/:id/destroy': { operationId: 'destroyDesktop', tag: 'Lifecycle' },
  'POST /v1/desktops/:id/fork': { operationId: 'forkDesktop', tag: 'Lifecycle' },
  'GET /v1/operations/:id': { operationId: 'getOperation', tag: 'Lifecycle' },
  'POST /v1/desktops/:id/exec': { operationId: 'execCommand', tag: 'Exec and processes' },
  'GET /v1/desktops/:id/processes/:process_id': { operationId: 'getProcess', tag: 'Exec and processes' },
  'GET /v1/desktops/:id/files/*': { operationId: 'readFile', tag: 'Files' },
  'PUT /v1/desktops/:id/files/*': { operationId: 'writeFile', tag: 'Files' },
  'DELETE /v1/desktops/:id/files/*': { operationId: 'deletePath', tag: 'Files' },
  'GET /v1/desktops/:id/files-meta/*': { operationId: 'statPath', tag: 'Files' },
  'GET /v1/desktops/:id/dir/*': { operationId: 'listDirectory', tag: 'Files' },
  'POST /v1/desktops/:id/screenshot': { operationId: 'takeScreenshot', tag: 'Computer use' },
  'POST /v1/desktops/:id/input': { operationId: 'sendInput', tag: 'Computer use' },
  'GET /v1/desktops/:id/display': { operationId: 'getDisplay', tag: 'Computer use' },
  'PUT /v1/desktops/:id/display': { operationId: 'setDisplay', tag: 'Computer use' },
  'POST /v1/desktops/:id/stream': { operationId: 'createStreamTicket', tag: 'Computer use' },
  'GET /v1/desktops/:id/ports': { operationId: 'listPortExposures', tag: 'Ports' },
  'POST /v1/desktops/:id/ports': { operationId: 'exposePort', tag: 'Ports' },
  'DELETE /v1/desktops/:id/ports/:port': { operationId: 'deletePortExposure', tag: 'Ports' },
  'GET /v1/webhooks': { operationId: 'listWebhooks', tag: 'Webhooks' },
  'POST /v1/webhooks': { operationId: 'createWebhook', tag: 'Webhooks' },
  'DELETE /v1/webhooks/:id': { operationId: 'deleteWebhook', tag: 'Webhooks' },
  'GET /v1/webhooks/:id/deliveries': { operationId: 'listWebhookDeliveries', tag: 'Webhooks' },
  'GET /v1/usage': { operationId: 'getUsage', tag: 'Usage' },
  'POST /v1/keys': { operationId: 'createApiKey', tag: 'API keys' },
  'GET /v1/keys': { operationId: 'listApiKeys', tag: 'API keys' },
  'DELETE /v1/keys/:id': { operationId: 'revokeApiKey', tag: 'API keys' },
};

/** The `Retry-After` header every 503 may carry (SPEC 7: retryable; honor it when present). */
export const RETRY_AFTER_HEADER = {
  // @fastify/swagger wraps the header's JSON schema in `{schema, description}` itself.
  'Retry-After': { type: 'integer', minimum: 0, description: 'Seconds to wait before retrying' },
} as const;
