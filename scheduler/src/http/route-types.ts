/**
 * What a route module needs from the application, without importing it: the app's type, the
 * services it is given, and the fields our hooks add to Fastify's request and route config.
 * app.ts builds the app and calls every route module; the route modules import only this (and
 * error-responses.ts), so the HTTP layer has no import cycle.
 */
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { Logger } from '../../../shared/src/log.js';
import type { DesktopService } from '../services/desktops.js';
import type { LifecycleService } from '../services/lifecycle.js';
import type { OperationWaiter } from '../services/waiter.js';
import type { UsageService } from '../services/usage.js';
import type { GuestService } from '../services/guest.js';
import type { WebhookService } from '../services/webhooks.js';
import type { PortService } from '../services/ports.js';
import type { SchedulerMetrics } from '../observability/metrics.js';
import type { KeyService } from '../services/keys.js';

declare module 'fastify' {
  interface FastifyRequest {
    orgId: string;
  }
  interface FastifyContextConfig {
    public?: boolean;
    /** The route reads its body as a raw byte stream (file writes); documented as binary. */
    rawBody?: boolean;
    /** An admin API route (admin/routes.ts): the admin token, not an org credential; its own document. */
    admin?: boolean;
  }
}

export interface AppDeps {
  logger: Logger;
  authenticate(request: import('fastify').FastifyRequest): Promise<string>;
  desktops: DesktopService;
  lifecycle: LifecycleService;
  waiter: OperationWaiter;
  usage: UsageService;
  guest: GuestService;
  webhooks: WebhookService;
  ports: PortService;
  keys: KeyService;
  waitCapMs: number;
  metrics: SchedulerMetrics;
  /** `/readyz`: null when the replica can serve, else why not. */
  notReady(): Promise<string | null>;
}

export type App = FastifyInstance<
  import('http').Server,
  import('http').IncomingMessage,
  import('http').ServerResponse,
  Logger,
  TypeBoxTypeProvider
>;
