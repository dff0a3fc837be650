/**
 * How each route is named in the OpenAPI document: an `operationId` (what generated clients call
 * the method) and a tag (how documentation groups it), in one table, so a new route without a name
 * fails the document test rather than shipping as `post_v1_desktops_id_wake`. Also the prose the
 * document opens with (errors, retries, lists), the tags' descriptions, an example of every JSON
 * request body, and what every 503 says about `Retry-After`.
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
  'POST /v1/desktops/:id/terminals': { operationId: 'createTerminalTicket', tag: 'Exec and processes' },
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

/** The `Retry-After` header every 503 may carry (docs/api.md §7: retryable; honor it when present). */
export const RETRY_AFTER_HEADER = {
  // @fastify/swagger wraps the header's JSON schema in `{schema, description}` itself.
  'Retry-After': { type: 'integer', minimum: 0, description: 'Seconds to wait before retrying' },
} as const;

/** The document's own introduction: what holds for every operation. */
export const API_DESCRIPTION = [
  'Persistent Linux cloud desktops: create them, wake and hibernate them, fork them, run commands and',
  'move files inside them, see and drive their screens, publish their TCP ports, and read usage.',
  '',
  '**Authentication.** Every operation but this document takes `Authorization: Bearer <key>`: an API',
  'key (`svc_sk_…`) or a JWT from a configured identity provider. A resource of another organization',
  'answers exactly like a missing one (404).',
  '',
  '**Errors.** Every answer with a status of 400 or more is `application/problem+json` (RFC 9457)',
  'with `status` equal to the HTTP status. A request that fails its schema answers 400 with `detail`',
  'naming the field and what it may be, and an `errors` array of `{field, message}`. Request bodies',
  'are closed: a member the operation does not know answers 400 naming it. A 500 carries a',
  '`request_id` that the server logged with the failure.',
  '',
  '**Retries.** A 503 is retryable; wait the `Retry-After` seconds when it is given, otherwise back',
  'off exponentially. Lifecycle operations answer an operation to poll at `/v1/operations/{id}`, or',
  'wait for it with `?wait=true`; creates take an `Idempotency-Key` header.',
  '',
  '**Lists and pagination.** Lists are not paginated: `GET /v1/desktops`, `/v1/webhooks`,',
  '`/v1/keys` and a desktop\'s `ports` answer every item of the organization in one array.',
  'The only long list, a webhook endpoint\'s delivery log, answers its newest `limit` entries',
  '(default 50, at most 200), newest first.',
].join('\n');

export const TAG_DESCRIPTIONS: Readonly<Record<string, string>> = {
  Meta: 'This document',
  Desktops: 'Create, list, read and configure desktops',
  Lifecycle: 'Wake, hibernate, destroy and fork desktops; the operations that track them',
  'Exec and processes': 'Run commands inside an awake desktop, in the foreground or detached, or open a terminal in it',
  Files: "Read, write, list and delete files in a desktop's filesystem",
  'Computer use': 'Screenshots, mouse and keyboard input, display size and live screen streams',
  Ports: "Publish a desktop's TCP ports at URLs of the port ingress",
  Webhooks: 'Signed notifications of lifecycle events, and their delivery log',
  Usage: 'Metered time and projected cost',
  'API keys': "Create, list and revoke the organization's API keys",
};

/** An example of each JSON request body, by operation id (the document test requires one each). */
export const REQUEST_EXAMPLES: Readonly<Record<string, unknown>> = {
  createDesktop: { tier: 'default', idle_timeout_secs: 1800, env: { GREETING: 'hello' }, setup_script: 'mkdir -p ~/work' },
  updateDesktop: { idle_timeout_secs: 3600 },
  wakeDesktop: { expected_generation: 3 },
  hibernateDesktop: { expected_generation: 3 },
  destroyDesktop: {},
  forkDesktop: { count: 2, acknowledge_shared_state: true, ephemeral: false },
  execCommand: { command: 'uname -a', timeout_secs: 30 },
  createTerminalTicket: { cols: 120, rows: 40 },
  takeScreenshot: { encoding: 'base64', region: { x: 0, y: 0, width: 640, height: 480 }, scale_percent: 50 },
  sendInput: {
    actions: [
      { type: 'click', x: 100, y: 200 },
      { type: 'type', text: 'hello' },
      { type: 'key', combo: 'ctrl+s' },
    ],
  },
  setDisplay: { width: 1280, height: 800 },
  createStreamTicket: { claim: 'view' },
  exposePort: { port: 8080, public: false },
  createWebhook: { url: 'https://hooks.example.com/canto', events: ['desktop.woken', 'desktop.hibernated'] },
  createApiKey: { name: 'ci runner' },
};
