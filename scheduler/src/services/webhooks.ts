/**
 * Webhook endpoints and their delivery logs (docs/api.md §2.10, 2.11, 4.8). An endpoint is a URL that
 * passed the registration rules, the event types it wants, and a signing secret that is shown
 * once, in the create response, and stored only sealed with the scheduler's secret key (the
 * dispatcher needs the secret itself to sign, so a hash would not do). Another org's endpoint
 * answers exactly like a missing one.
 */
import type { Sql } from '../store/db.js';
import * as store from '../store/webhooks.js';
import type { SecretBox } from '../crypto/secret-box.js';
import { errors } from '../errors.js';
import type { CreateWebhookBody, WebhookDeliveryJson, WebhookEndpointJson, WebhookEventType } from '../api/schemas.js';
import { checkEndpointUrl } from '../webhooks/endpoint-url.js';
import { endpointSecretContext, newWebhookSecret } from '../webhooks/signature.js';

/** Endpoints per org: enough for several environments and tools, few enough to bound fan-out. */
export const WEBHOOK_ENDPOINTS_PER_ORG = 20;
export const DELIVERIES_DEFAULT_LIMIT = 50;
export const DELIVERIES_MAX_LIMIT = 200;

export interface WebhookServiceDeps {
  sql: Sql;
  secrets: SecretBox;
  /** The deployment allows loopback hosts and plain http (local development). */
  allowLoopback: boolean;
}

export class WebhookService {
  constructor(private readonly deps: WebhookServiceDeps) {}

  async create(orgId: string, body: CreateWebhookBody): Promise<WebhookEndpointJson> {
    const url = checkEndpointUrl(body.url, { allowLoopback: this.deps.allowLoopback });
    if (!url.ok) throw errors.badRequest(url.reason);
    const secret = newWebhookSecret();
    const row = await store.insertEndpoint(
      this.deps.sql,
      {
        orgId,
        url: url.url,
        events: [...new Set(body.events)],
        sealSecret: (endpointId) => this.deps.secrets.seal(secret, endpointSecretContext(endpointId)),
      },
      WEBHOOK_ENDPOINTS_PER_ORG,
    );
    if (!row) throw errors.badRequest(`an org may have at most ${WEBHOOK_ENDPOINTS_PER_ORG} webhook endpoints; delete one first`);
    return { ...toEndpointJson(row), secret };
  }

  async list(orgId: string): Promise<WebhookEndpointJson[]> {
    return (await store.listEndpoints(this.deps.sql, orgId)).map(toEndpointJson);
  }

  async remove(orgId: string, id: string): Promise<void> {
    if (!(await store.deleteEndpoint(this.deps.sql, orgId, id))) throw errors.webhookNotFound();
  }

  async deliveries(orgId: string, id: string, limitText: string | undefined): Promise<WebhookDeliveryJson[]> {
    const limit = parseLimit(limitText);
    if (!(await store.endpointExists(this.deps.sql, orgId, id))) throw errors.webhookNotFound();
    return (await store.listDeliveries(this.deps.sql, id, limit)).map(toDeliveryJson);
  }
}

/** `limit` of the delivery log: digits only (the schema checks that), 1..200, default 50. */
export function parseLimit(text: string | undefined): number {
  if (text === undefined) return DELIVERIES_DEFAULT_LIMIT;
  const limit = /^\d{1,16}$/.test(text) ? Number(text) : NaN;
  if (!(limit >= 1 && limit <= DELIVERIES_MAX_LIMIT)) throw errors.badRequest(`limit must be an integer from 1 to ${DELIVERIES_MAX_LIMIT}`);
  return limit;
}

function toEndpointJson(row: store.WebhookEndpointRow): WebhookEndpointJson {
  return { id: row.id, url: row.url, events: row.events as WebhookEventType[], createdAt: row.created_at.toISOString() };
}

function toDeliveryJson(row: store.WebhookDeliveryRow): WebhookDeliveryJson {
  return {
    id: row.id,
    eventType: row.event_type as WebhookEventType,
    state: row.state,
    attempts: row.attempts,
    lastStatus: row.last_status,
    lastError: row.last_error,
    nextAttemptAt: row.state === 'pending' && row.next_attempt_at ? row.next_attempt_at.toISOString() : null,
    payload: JSON.parse(row.body) as Record<string, unknown>,
    createdAt: row.created_at.toISOString(),
    deliveredAt: row.delivered_at ? row.delivered_at.toISOString() : null,
  };
}
