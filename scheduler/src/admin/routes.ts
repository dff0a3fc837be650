/**
 * The admin API, `/admin/v1`, served by every replica on the `/v1` listener: hosts (list, show,
 * cordon, uncordon, drain, remove, forget a lost one, reset its key), desktops of every org and their moves (admin/move-routes.ts) and orgs with their API keys. It lives in a Fastify context of its
 * own, which authenticates with the admin token (admin/auth.ts) instead of an org credential and
 * has its own OpenAPI document (admin/document.ts). Answers of 400 and up are problem+json from
 * the application's one error handler; request bodies admit no member they do not name.
 *
 * Changes are logged (component `admin`): who changed the fleet is the token holder, so the log
 * says what changed and when.
 */
import { Type } from '@sinclair/typebox';
import type { Logger } from '../../../shared/src/log.js';
import type { App } from '../http/route-types.js';
import { errorResponses } from '../http/error-responses.js';
import type { AdminService } from './service.js';
import { createAdminTokenCheck } from './auth.js';
import { registerAdminDocument } from './document.js';
import { registerMoveRoutes } from './move-routes.js';
import type { MoveService } from './moves.js';
import type { AdminDesktops } from './desktops.js';
import {
  AdminCreatedKeyJson, AdminHostJson, AdminKeyJson, AdminOrgJson, CreateOrgBody, CreateOrgKeyBody, ForgetHostJson, HostIdParams, OrgIdParams, OrgKeyParams,
} from './schemas.js';

export interface AdminApiDeps {
  service: AdminService;
  moves: MoveService;
  desktops: AdminDesktops;
  /** CANTO_ADMIN_TOKEN; null: the admin API answers 503. */
  token: string | null;
  logger: Logger;
}

const HOSTS = ['Hosts'];
const ORGS = ['Orgs and keys'];
const NO_CONTENT = { description: 'Done', type: 'null' } as const;
/** Cordon and uncordon take no options: an empty body, or none. */
const NoOptions = Type.Object({}, { additionalProperties: false });

export async function registerAdminApi(app: App, deps: AdminApiDeps): Promise<void> {
  const check = createAdminTokenCheck(deps.token);
  const log = deps.logger.child({ component: 'admin' });
  if (deps.token === null) log.warn('CANTO_ADMIN_TOKEN is not set: the admin API (/admin/v1) answers 503 on this replica');

  await app.register(async (admin: App) => {
    // Every route of this context is an admin route, whoever writes the next one: the org
    // authenticator passes it by and the /v1 document leaves it out (http/app.ts).
    admin.addHook('onRoute', (route) => {
      route.config = { ...(route.config ?? {}), admin: true };
    });
    admin.addHook('onRequest', async (request) => {
      if (!request.routeOptions.config.public) check(request.headers.authorization);
    });
    await registerAdminDocument(admin);
    registerHostRoutes(admin, deps.service, log);
    registerOrgRoutes(admin, deps.service, log);
    registerMoveRoutes(admin, deps.moves, deps.service, deps.desktops, log);
  });
}

function registerHostRoutes(admin: App, service: AdminService, log: Logger): void {
  admin.get(
    '/admin/v1/hosts',
    {
      schema: {
        summary: 'List hosts: state, capacity and use, desktops by state, agent',
        operationId: 'listHosts',
        tags: HOSTS,
        response: { 200: Type.Object({ hosts: Type.Array(AdminHostJson) }), ...errorResponses() },
      },
    },
    async () => ({ hosts: await service.listHosts() }),
  );

  admin.get(
    '/admin/v1/hosts/:host_id',
    {
      schema: {
        summary: 'Show one host',
        operationId: 'getHost',
        tags: HOSTS,
        params: HostIdParams,
        response: { 200: AdminHostJson, ...errorResponses(400, 404) },
      },
    },
    async (request) => service.getHost(request.params.host_id),
  );

  for (const [action, cordoned] of [['cordon', true], ['uncordon', false]] as const) {
    admin.post(
      `/admin/v1/hosts/:host_id/${action}`,
      {
        schema: {
          summary: cordoned
            ? 'Cordon a host: no new desktops are placed on it; those on it stay (idempotent)'
            : 'Uncordon a host: placement may use it again (idempotent)',
          operationId: `${action}Host`,
          tags: HOSTS,
          params: HostIdParams,
          body: NoOptions,
          response: { 200: AdminHostJson, ...errorResponses(400, 404) },
        },
      },
      async (request) => {
        const host = await service.setCordoned(request.params.host_id, cordoned);
        log.info({ hostId: host.id }, cordoned ? 'host cordoned' : 'host uncordoned');
        return host;
      },
    );
  }

  admin.post(
    '/admin/v1/hosts/:host_id/forget',
    {
      schema: {
        summary:
          'Declare a host that is gone for good lost: its desktops, whose disks were only there, are destroyed (`desktop.destroyed` with `data.reason: "host_lost"`), ' +
          'except those a failed move committed to it before they ever ran there, which are placed back on the move\'s source (`placed_back`); ' +
          'its agent is refused, and its record goes once it holds none. Ask again until `removed`; 409 while its agent is connected',
        operationId: 'forgetHost',
        tags: HOSTS,
        params: HostIdParams,
        body: NoOptions,
        response: { 200: ForgetHostJson, ...errorResponses(400, 404, 409) },
      },
    },
    async (request) => {
      const forgotten = await service.forgetHost(request.params.host_id);
      log.warn({ hostId: forgotten.host_id, destroying: forgotten.destroying, waiting: forgotten.waiting, removed: forgotten.removed }, 'host declared lost; its desktops are destroyed');
      for (const back of forgotten.placed_back) {
        log.warn({ desktopId: back.desktop_id, lostHostId: forgotten.host_id, hostId: back.host_id, moveId: back.move_id }, 'a desktop its move never started on the lost host is placed back on the move\'s source, which kept its copy');
      }
      return forgotten;
    },
  );

  admin.post(
    '/admin/v1/hosts/:host_id/reset-key',
    {
      schema: {
        summary: "Forget the key a host registered with (its key file was lost): the next hello naming the host id records the key it sends. Restart the host's agent right after",
        operationId: 'resetHostKey',
        tags: HOSTS,
        params: HostIdParams,
        body: NoOptions,
        response: { 200: AdminHostJson, ...errorResponses(400, 404) },
      },
    },
    async (request) => {
      const host = await service.resetHostKey(request.params.host_id);
      log.warn({ hostId: host.id }, 'host key reset: the next hello naming this host records its key');
      return host;
    },
  );

  admin.delete(
    '/admin/v1/hosts/:host_id',
    {
      schema: {
        summary: "Remove a host's record: only when it holds no desktop and its agent is stopped (409 otherwise)",
        operationId: 'removeHost',
        tags: HOSTS,
        params: HostIdParams,
        response: { 204: NO_CONTENT, ...errorResponses(400, 404, 409) },
      },
    },
    async (request, reply) => {
      await service.removeHost(request.params.host_id);
      log.info({ hostId: request.params.host_id }, 'host removed');
      return reply.code(204).send();
    },
  );
}

function registerOrgRoutes(admin: App, service: AdminService, log: Logger): void {
  admin.get(
    '/admin/v1/orgs',
    {
      schema: {
        summary: 'List orgs with their live key and desktop counts',
        operationId: 'listOrgs',
        tags: ORGS,
        response: { 200: Type.Object({ orgs: Type.Array(AdminOrgJson) }), ...errorResponses() },
      },
    },
    async () => ({ orgs: await service.listOrgs() }),
  );

  admin.post(
    '/admin/v1/orgs',
    {
      schema: {
        summary: 'Create an org (409 when one has the name)',
        operationId: 'createOrg',
        tags: ORGS,
        body: CreateOrgBody,
        response: { 201: AdminOrgJson, ...errorResponses(400, 409, 413) },
      },
    },
    async (request, reply) => {
      const org = await service.createOrg(request.body.name);
      log.info({ orgId: org.id }, 'org created');
      return reply.code(201).send(org);
    },
  );

  admin.get(
    '/admin/v1/orgs/:org_id/keys',
    {
      schema: {
        summary: "List an org's live API keys (never their secrets)",
        operationId: 'listOrgKeys',
        tags: ORGS,
        params: OrgIdParams,
        response: { 200: Type.Object({ keys: Type.Array(AdminKeyJson) }), ...errorResponses(400, 404) },
      },
    },
    async (request) => ({ keys: await service.listKeys(request.params.org_id) }),
  );

  admin.post(
    '/admin/v1/orgs/:org_id/keys',
    {
      schema: {
        summary: 'Create an API key for an org; the key itself is in this response only',
        operationId: 'createOrgKey',
        tags: ORGS,
        params: OrgIdParams,
        body: CreateOrgKeyBody,
        response: { 201: AdminCreatedKeyJson, ...errorResponses(400, 404, 413) },
      },
    },
    async (request, reply) => {
      const key = await service.createKey(request.params.org_id, request.body.name ?? null);
      log.info({ orgId: request.params.org_id, keyId: key.id }, 'API key created');
      return reply.code(201).send(key);
    },
  );

  admin.delete(
    '/admin/v1/orgs/:org_id/keys/:key_id',
    {
      schema: {
        summary: 'Revoke an API key: every replica refuses it from its next request',
        operationId: 'revokeOrgKey',
        tags: ORGS,
        params: OrgKeyParams,
        response: { 204: NO_CONTENT, ...errorResponses(400, 404) },
      },
    },
    async (request, reply) => {
      await service.revokeKey(request.params.org_id, request.params.key_id);
      log.info({ orgId: request.params.org_id, keyId: request.params.key_id }, 'API key revoked');
      return reply.code(204).send();
    },
  );
}
