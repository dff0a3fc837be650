/**
 * The HTTP application: Fastify with TypeBox route schemas, an OpenAPI 3.1 document generated
 * from those schemas, bearer authentication on every `/v1` route but the document itself,
 * problem+json for every non-2xx answer, and the web console's static files at `/console/`.
 */
import { randomBytes } from 'node:crypto';
import { retryableDatabaseFault } from '../store/db-faults.js';
import Fastify, { type FastifyError, type FastifyReply } from 'fastify';
import swagger from '@fastify/swagger';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiError, errors, problem } from '../errors.js';
import { answerClientError, answerUnroutable, MISSING_HOST } from './client-errors.js';
import { describeValidation } from './validation-problem.js';
import { buildSerializerOncePerSchema } from './serializers.js';
import { errorResponses } from './error-responses.js';
import type { App, AppDeps } from './route-types.js';
import { API_DESCRIPTION, OPERATIONS, REQUEST_EXAMPLES, TAG_DESCRIPTIONS } from './operations-doc.js';
import { DesktopJson, OperationJson, PortExposureJson, Problem, UsageResponse, WebhookDeliveryJson, WebhookEndpointJson, ApiKeyJson, CreatedApiKeyJson } from '../api/schemas.js';
import { INPUT_ACTION_SCHEMAS, DisplayResponse, ExecDetachedResponse, ExecResponse, FileStatJson, InputResponse, ListDirResponse, ProcessStatusResponse, ScreenshotBase64Response, StreamTicketResponse, TerminalTicketResponse } from '../api/guest-schemas.js';
import { registerDesktopRoutes } from './routes/desktops.js';
import { registerLifecycleRoutes } from './routes/lifecycle.js';
import { registerOperationRoutes } from './routes/operations.js';
import { registerUsageRoutes } from './routes/usage.js';
import { registerExecRoutes } from './routes/exec.js';
import { registerFileRoutes } from './routes/files.js';
import { registerDisplayRoutes } from './routes/display.js';
import { registerComputerUseRoutes } from './routes/computer-use.js';
import { registerTerminalRoutes } from './routes/terminals.js';
import { registerWebhookRoutes } from './routes/webhooks.js';
import { registerPortRoutes } from './routes/ports.js';
import { registerHealthRoutes } from './routes/health.js';
import { registerKeyRoutes } from './routes/keys.js';
import { registerConsoleRoutes } from './routes/console.js';

export type { App, AppDeps } from './route-types.js';

export const BODY_LIMIT_BYTES = 2 * 1024 * 1024;

/**
 * Request ids draw 9 random bytes each from a pool filled 4 KiB at a time: as unguessable as a
 * call to `randomBytes(9)` per request, which measured a few percent of a hot read's CPU.
 */
const idPool = { bytes: Buffer.alloc(0), at: 0 };
function nextRequestId(): string {
  if (idPool.at + 9 > idPool.bytes.length) {
    idPool.bytes = randomBytes(4096);
    idPool.at = 0;
  }
  idPool.at += 9;
  return `req_${idPool.bytes.toString('base64url', idPool.at - 9, idPool.at)}`;
}

const NO_SUCH_ROUTE = 'no such route';

export async function buildApp(deps: AppDeps): Promise<App> {
  const app = Fastify({
    // Fastify's per-request access lines are info: the HTTP logger starts at warn (or quieter,
    // if the root logger is), and failures are logged by the error handler.
    loggerInstance: deps.logger.child(
      { component: 'http' },
      { level: deps.logger.levelVal > deps.logger.levels.values.warn! ? deps.logger.level : 'warn' },
    ),
    bodyLimit: BODY_LIMIT_BYTES,
    // Guest paths travel in the URL (docs/api.md §4.4), up to PATH_MAX.
    routerOptions: { maxParamLength: 8192 },
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false, allErrors: false, discriminator: true } },
    schemaController: { compilersFactory: { buildSerializer: buildSerializerOncePerSchema } },
    // Fastify's own 503 while closing is not a problem (docs/api.md §7): the hook below answers it.
    return503OnClosing: false,
    // Refused below with problem+json rather than by Node with a bare 400 (client-errors.ts).
    http: { requireHostHeader: false },
    // A request id is ours to give, never the client's: it is what a 500's answer and its log
    // line share, so it must not be guessable or collide across replicas.
    genReqId: nextRequestId,
    requestIdHeader: false,
    clientErrorHandler: answerClientError,
    // A path whose percent-encoding decodes to nothing (`%ff`, a lone `%`) never reaches routing.
    frameworkErrors: (error, _request, reply) => {
      const status = (error as FastifyError).statusCode ?? 400;
      const detail = (error as FastifyError).code === 'FST_ERR_BAD_URL' ? 'the URL is not validly percent-encoded' : 'bad request';
      void (reply as unknown as FastifyReply).code(status).type('application/problem+json').send(problem(status, detail));
    },
  }).withTypeProvider<TypeBoxTypeProvider>();
  answerUnroutable(app.server);

  app.decorateRequest('orgId', '');
  for (const schema of [
    Problem, DesktopJson, OperationJson, UsageResponse,
    ExecResponse, ExecDetachedResponse, ProcessStatusResponse, FileStatJson, ListDirResponse, DisplayResponse,
    ScreenshotBase64Response, InputResponse, StreamTicketResponse, TerminalTicketResponse,
    WebhookEndpointJson, WebhookDeliveryJson, PortExposureJson, ApiKeyJson, CreatedApiKeyJson,
    ...INPUT_ACTION_SCHEMAS,
  ]) app.addSchema(schema);

  // An empty body on a route whose body is optional means `{}` (docs/api.md §2.4); anything else goes
  // through Fastify's own parser, which also refuses `__proto__` and `constructor` keys.
  const parseJson = app.getDefaultJsonParser('error', 'error');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (req, body, done) => {
    if ((body as string).trim() === '') return done(null, undefined);
    void parseJson(req, body as string, (err, value) => {
      if (!err) return done(null, value);
      const malformed = new Error(/prototype|constructor/i.test(err.message) ? 'JSON body with a forbidden key' : 'malformed JSON body') as FastifyError;
      malformed.statusCode = 400;
      done(malformed, undefined);
    });
  });

  // The API takes JSON only, but an empty body is no body at all whatever its label: `curl -d ''`
  // sends an empty form, and an empty mutation body means `{}` (docs/api.md §2.4). Anything else is 415.
  app.removeContentTypeParser('text/plain');
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => {
    if ((body as Buffer).length === 0) return done(null, undefined);
    const err = new Error('unsupported media type; send application/json') as FastifyError;
    err.statusCode = 415;
    done(err, undefined);
  });

  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Canto cloud desktop API',
        version: '1.0.0',
        description: API_DESCRIPTION,
        license: { name: 'Apache-2.0', identifier: 'Apache-2.0' },
      },
      // Relative: the document describes the server that serves it.
      servers: [{ url: '/', description: 'this deployment' }],
      tags: [...new Set(Object.values(OPERATIONS).map((o) => o.tag))].map((name) => ({ name, description: TAG_DESCRIPTIONS[name] })),
      components: { securitySchemes: { bearer_auth: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearer_auth: [] }],
    },
    refResolver: { buildLocalReference: (json, _base, _frag, i) => (json.$id as string) ?? `def-${i}` },
    transform: documentRoute,
    // @fastify/swagger marks every request body required, but the preValidation hook below
    // turns a missing body into `{}`: a body whose schema requires no member is optional
    // (docs/api.md §2.3, 2.4), and the document has to say so or generated clients always send one.
    transformObject: (document) => ('openapiObject' in document ? addRequestExamples(markOptionalBodies(document.openapiObject)) : document.swaggerObject),
  });

  // Bodies are optional on mutation routes (docs/api.md §2.3, 2.4): a missing body validates as `{}`.
  app.addHook('preValidation', async (request) => {
    if (request.body === undefined && request.method !== 'GET') request.body = {};
  });

  // From the stop on, what still arrives on an open connection (pipelined behind a request in
  // flight, or sent as the stop began) is refused before any work; Fastify has marked the answer
  // `Connection: close`, so the retry goes out on a new connection.
  let stopping = false;
  app.addHook('preClose', async () => {
    stopping = true;
  });
  app.addHook('onRequest', async (request) => {
    if (stopping) throw errors.replicaStopping();
    if (request.headers.host === undefined && request.raw.httpVersion === '1.1') throw errors.badRequest(MISSING_HOST);
    // Answered before the body is read: an upload to a mistyped path is a 404, not a 413 for a
    // body over the JSON limit that no route would have taken.
    if (!request.routeOptions.url) throw new ApiError(404, NO_SUCH_ROUTE);
    if (request.routeOptions.config.public || request.routeOptions.config.admin || !request.routeOptions.url) return;
    request.orgId = await deps.authenticate(request);
  });

  // Labelled by route template, never by path: ids and guest paths would make every series unique.
  app.addHook('onResponse', async (request, reply) => {
    deps.metrics.httpDuration.observe(
      { method: request.method, route: request.routeOptions.url ?? 'unmatched', status_code: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    );
  });

  app.setErrorHandler((error: FastifyError | ApiError, request, reply) => {
    if (error instanceof ApiError) {
      // A 500 of ours is a guest's own failure (docs/api.md §4.5, 4.6): logged, and its answer names the
      // request so the two can be found together.
      const extra = error.status === 500 ? { ...error.extra, request_id: request.id } : error.extra;
      if (error.status === 500) request.log.warn({ detail: error.detail, url: request.routeOptions.url }, 'guest failure answered 500');
      void reply.code(error.status).headers(error.headers).type('application/problem+json').send(problem(error.status, error.detail, extra));
      return;
    }
    const status = error.statusCode ?? 500;
    if (error.validation) {
      const schemas = request.routeOptions.schema as Record<string, unknown> | undefined;
      const part = error.validationContext ?? '';
      const data = (request as unknown as Record<string, unknown>)[part];
      const found = describeValidation(error.validation, error.validationContext, schemas?.[part], data, (id) => app.getSchema(id));
      void reply.code(400).type('application/problem+json').send({ ...problem(400, `${found.field} ${found.message}`), errors: [found] });
      return;
    }
    if (status >= 400 && status < 500) {
      void reply.code(status).type('application/problem+json').send(problem(status, error.message));
      return;
    }
    // The database's passing trouble (a restart, a dropped link, a serialization failure) is the
    // contract's retryable 503, not a 500 a client may not repeat. A create without an
    // Idempotency-Key whose COMMIT was cut off may have happened: docs/api.md §7 says so.
    if (retryableDatabaseFault(error)) {
      request.log.warn({ code: (error as { code?: unknown }).code, route: request.routeOptions.url, method: request.method }, 'database fault answered 503');
      void reply.code(503).header('retry-after', '1').type('application/problem+json').send(problem(503, 'the database is briefly unavailable; retry'));
      return;
    }
    // Never the request's URL: guest paths and ids in it are the client's data. The route
    // template and the request id (in every line of request.log) are enough to find it.
    request.log.error({ err: error, route: request.routeOptions.url, method: request.method }, 'request failed');
    void reply
      .code(500)
      .type('application/problem+json')
      .send(problem(500, `internal error; quote request ${request.id} when reporting it`, { request_id: request.id }));
  });

  app.setNotFoundHandler((request, reply) => {
    void reply.code(404).type('application/problem+json').send(problem(404, NO_SUCH_ROUTE));
  });

  app.get(
    '/v1/openapi.json',
    {
      config: { public: true },
      schema: {
        summary: 'This OpenAPI 3.1 document (no credential needed)',
        security: [],
        response: {
          200: { type: 'object', additionalProperties: true },
          // Answered before routing, as on every route; the only failure a public GET can meet.
          431: { ...errorResponses(431)[431]!, description: 'Request headers too large (RFC 9457 problem details)' },
        },
      },
    },
    async () => app.swagger(),
  );

  registerHealthRoutes(app, deps);
  registerDesktopRoutes(app, deps);
  registerLifecycleRoutes(app, deps);
  registerOperationRoutes(app, deps);
  registerUsageRoutes(app, deps);
  registerExecRoutes(app, deps);
  registerFileRoutes(app, deps);
  registerDisplayRoutes(app, deps);
  registerComputerUseRoutes(app, deps);
  registerTerminalRoutes(app, deps);
  registerWebhookRoutes(app, deps);
  registerPortRoutes(app, deps);
  registerKeyRoutes(app, deps);
  registerConsoleRoutes(app);
  return app;
}

/**
 * How a route appears in the document. Guest path routes capture the path with Fastify's `*`,
 * which docs/api.md §4 names `{path}`; a raw-body route has no body schema (its body is a stream), so its
 * binary body is described here.
 */
function documentRoute({ schema, url, route }: { schema: unknown; url: string; route: { config?: unknown; method?: unknown } }) {
  if ((route.config as { admin?: boolean } | undefined)?.admin) return { schema: { hide: true }, url };
  const doc = { ...(schema as Record<string, unknown>) };
  const methods = Array.isArray(route.method) ? route.method : [route.method];
  const named = OPERATIONS[`${String(methods.find((m) => m !== 'HEAD'))} ${url}`];
  if (named) {
    doc.operationId = named.operationId;
    doc.tags = [named.tag];
  }
  let documentedUrl = url;
  if (url.endsWith('/*')) {
    documentedUrl = `${url.slice(0, -1)}:path`;
    const params = doc.params as { properties?: Record<string, unknown>; required?: string[] } | undefined;
    if (params?.properties?.['*']) {
      const { '*': wildcard, ...rest } = params.properties;
      doc.params = { ...params, properties: { ...rest, path: wildcard }, required: (params.required ?? []).map((n) => (n === '*' ? 'path' : n)) };
    }
  }
  if ((route.config as { rawBody?: boolean } | undefined)?.rawBody) {
    doc.body = { content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } };
  } else if (doc.body && doc.response) {
    // Every JSON body is held to the body limit and the media type, whatever the route says.
    const limits = errorResponses(413, 415);
    doc.response = { [413]: limits[413], [415]: limits[415], ...(doc.response as object) };
  }
  return { schema: doc, url: documentedUrl };
}

interface BodyDoc {
  requestBody?: { required?: boolean; content?: Record<string, { schema?: { required?: unknown[] } }> };
}

export function markOptionalBodies<T extends { paths?: object }>(document: T): T {
  for (const item of Object.values(document.paths ?? {}) as Array<Record<string, BodyDoc>>) {
    for (const operation of Object.values(item)) {
      const body = operation.requestBody;
      if (!body?.content) continue;
      if (Object.values(body.content).every((media) => !media.schema?.required?.length)) body.required = false;
    }
  }
  return document;
}

/** Puts each operation's example on its JSON request body, where generated docs show it. */
function addRequestExamples<T extends { paths?: object }>(document: T): T {
  for (const item of Object.values(document.paths ?? {}) as Array<Record<string, BodyDoc & { operationId?: string }>>) {
    for (const operation of Object.values(item)) {
      const media = operation.requestBody?.content?.['application/json'] as { example?: unknown } | undefined;
      const example = operation.operationId ? REQUEST_EXAMPLES[operation.operationId] : undefined;
      if (media && example !== undefined) media.example = example;
    }
  }
  return document;
}
