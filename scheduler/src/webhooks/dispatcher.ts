/**
 * The webhook dispatcher: runs on the leader only, switched on and off with leadership. Each
 * round it turns new outbox events into deliveries (one per subscribed endpoint), claims the
 * deliveries that are due, and makes one attempt at each, at most `concurrency` at a time, and at
 * most a quarter of them (rounded up) for one org: an org whose receivers hang until the timeout
 * then delays only its own deliveries, not every other org's. It
 * wakes when an event commits (the outbox trigger's notification), when an attempt finishes,
 * and every `pollMs` for retries that have come due.
 *
 * Every attempt is signed afresh and recorded; failures are retried on the schedule in
 * retry-schedule.ts, except refusals by the address guard, which fail at once. Stopping aborts
 * attempts in flight without recording them: their claim lease runs out and the next leader
 * attempts them again under the same delivery id. Delivery is therefore at least once, and a
 * receiver dedupes on `Svc-Webhook-Id`.
 */
import type { Logger } from '../../../shared/src/log.js';
import type { SecretBox } from '../crypto/secret-box.js';
import type { WebhookSettings } from '../config.js';
import type { AttemptRecord, ClaimedDelivery, OutboxEvent } from '../store/webhook-deliveries.js';
import { describeStatus, postDelivery, type AttemptResult } from './post-attempt.js';
import { retryDelayMs } from './retry-schedule.js';
import { endpointSecretContext, signatureHeader } from './signature.js';

/** The delivery log as the dispatcher uses it (store/webhook-deliveries.ts over PostgreSQL). */
export interface DeliveryQueue {
  fanOut(limit: number, render: (event: OutboxEvent) => string): Promise<number>;
  /** Due deliveries, claimed for `leaseMs`, none of the orgs in `skipOrgs`. */
  claim(limit: number, leaseMs: number, skipOrgs: readonly string[]): Promise<ClaimedDelivery[]>;
  /** Claimed deliveries not attempted after all, due again at once. */
  release(ids: readonly string[]): Promise<void>;
  record(id: string, attemptsBefore: number, outcome: AttemptRecord): Promise<boolean>;
  /** Subscribes to new outbox events; returns the unsubscribe. */
  listen(onEvent: () => void): Promise<() => Promise<void>>;
}

export interface DispatcherDeps {
  queue: DeliveryQueue;
  secrets: SecretBox;
  settings: WebhookSettings;
  logger: Logger;
  /** Whether this replica still leads (engine/leader.ts): a round starts only while it does. */
  leading?(): boolean;
}

const FAN_OUT_BATCH = 100;
/** Claims a round makes at most, each leaving out the orgs the one before found at their share. */
const CLAIM_ROUNDS = 4;

/**
 * The body every endpoint receives for an event: the outbox payload with its members in a
 * stable, readable order (`type` and `desktopId` first). Rendered once per event and stored, so
 * every attempt and the delivery log carry the same bytes.
 */
export function renderEventBody(event: OutboxEvent): string {
  const { type, desktopId, orgId, occurredAt, data, eventId, ...rest } = event.payload;
  return JSON.stringify({ type: type ?? event.type, desktopId, eventId, orgId: orgId ?? event.orgId, occurredAt, data: data ?? {}, ...rest });
}

export class WebhookDispatcher {
  private running = false;
  private ticking = false;
  private again = false;
  private timer: NodeJS.Timeout | null = null;
  private unlisten: (() => Promise<void>) | null = null;
  private aborter = new AbortController();
  private readonly inFlight = new Map<string, Promise<void>>();
  /** Attempts in flight per org: one org's slow or dead receivers may hold only `perOrg` of them. */
  private readonly inFlightByOrg = new Map<string, number>();
  private readonly perOrg: number;
  private readonly log: Logger;
  /** Long enough that a live attempt always ends (it is bounded by the timeout) before its claim does. */
  private readonly leaseMs: number;

  constructor(private readonly deps: DispatcherDeps) {
    this.log = deps.logger.child({ component: 'webhooks' });
    this.leaseMs = deps.settings.timeoutMs + Math.max(1_000, Math.floor(deps.settings.timeoutMs / 2));
    this.perOrg = Math.max(1, Math.ceil(deps.settings.concurrency / 4));
  }

  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    this.aborter = new AbortController();
    try {
      this.unlisten = await this.deps.queue.listen(() => this.kick());
    } catch (err) {
      // Polling still finds every event, only later.
      this.log.warn({ err }, 'could not subscribe to outbox notifications; polling only');
    }
    this.kick();
  }

  /** Stops claiming, aborts attempts in flight (left to their claim lease) and waits for them. */
  async stop(): Promise<void> {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.unlisten?.().catch(() => {});
    this.unlisten = null;
    this.aborter.abort();
    await Promise.allSettled([...this.inFlight.values()]);
  }

  private kick(): void {
    if (!this.running) return;
    if (this.ticking) {
      this.again = true;
      return;
    }
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.tick(), 0);
  }

  private async tick(): Promise<void> {
    if (!this.running || this.ticking) return;
    // A replica that cannot tell it still leads (its renewal overdue) delivers nothing: the
    // leader that may have taken over does (at least once, either way).
    if (this.deps.leading?.() === false) {
      this.timer = setTimeout(() => void this.tick(), this.deps.settings.pollMs);
      return;
    }
    this.ticking = true;
    this.again = false;
    try {
      while (this.running && (await this.deps.queue.fanOut(FAN_OUT_BATCH, renderEventBody)) === FAN_OUT_BATCH);
      await this.claimRounds();
    } catch (err) {
      this.log.error({ err }, 'webhook dispatch round failed');
    } finally {
      this.ticking = false;
      if (this.running) this.timer = setTimeout(() => void this.tick(), this.again ? 0 : this.deps.settings.pollMs);
    }
  }

  /**
   * Fills the free slots, each org up to its share. A claim that returned more of an org than
   * its share gives those back (due again at once) and the next claim leaves that org out, so a
   * large backlog of one org does not keep the slots it may not use empty while others wait.
   */
  private async claimRounds(): Promise<void> {
    const skip = new Set([...this.inFlightByOrg].filter(([, n]) => n >= this.perOrg).map(([org]) => org));
    for (let round = 0; round < CLAIM_ROUNDS && this.running; round++) {
      const free = this.deps.settings.concurrency - this.inFlight.size;
      if (free <= 0) return;
      const over: string[] = [];
      for (const delivery of await this.deps.queue.claim(free, this.leaseMs, [...skip])) {
        if ((this.inFlightByOrg.get(delivery.org_id) ?? 0) < this.perOrg) {
          this.launch(delivery);
        } else {
          over.push(delivery.id);
          skip.add(delivery.org_id);
        }
      }
      await this.deps.queue.release(over);
      if (over.length === 0) return;
    }
  }

  private launch(delivery: ClaimedDelivery): void {
    // A claim that returns after `stop` is left to its lease, like an aborted attempt.
    if (!this.running || this.inFlight.has(delivery.id)) return;
    const org = delivery.org_id;
    this.inFlightByOrg.set(org, (this.inFlightByOrg.get(org) ?? 0) + 1);
    const task = this.attempt(delivery)
      .catch((err: unknown) => this.log.error({ err, deliveryId: delivery.id }, 'webhook attempt could not be recorded'))
      .finally(() => {
        this.inFlight.delete(delivery.id);
        const left = (this.inFlightByOrg.get(org) ?? 1) - 1;
        if (left > 0) this.inFlightByOrg.set(org, left);
        else this.inFlightByOrg.delete(org);
        this.kick();
      });
    this.inFlight.set(delivery.id, task);
  }

  private async attempt(d: ClaimedDelivery): Promise<void> {
    const { settings, secrets, queue } = this.deps;
    const log = this.log.child({ deliveryId: d.id, endpointId: d.endpoint_id, eventType: d.event_type, attempt: d.attempts + 1 });
    let secret: string;
    try {
      secret = secrets.open(d.secret_sealed, endpointSecretContext(d.endpoint_id));
    } catch (err) {
      // Retried like a receiver that failed: a leader started with the wrong key (a deploy gone
      // wrong) would otherwise fail every delivery due meanwhile, for good, whoever fixes the key.
      log.error({ err }, 'the endpoint secret cannot be unsealed (was CANTO_SECRET_KEY changed?); the delivery is tried again later');
      await queue.record(d.id, d.attempts, this.outcome({ kind: 'error', message: 'internal error', permanent: false }, d.attempts + 1));
      return;
    }
    const timestamp = Math.floor(Date.now() / 1000);
    const headers = {
      'Svc-Webhook-Id': d.id,
      'Svc-Webhook-Event': d.event_type,
      'Svc-Signature': signatureHeader(secret, timestamp, d.body),
    };
    const result = await postDelivery(
      { url: d.url, body: d.body, headers },
      { policy: settings, timeoutMs: settings.timeoutMs, signal: this.aborter.signal },
    );
    if (result.kind === 'aborted') return;
    const outcome = this.outcome(result, d.attempts + 1);
    const recorded = await queue.record(d.id, d.attempts, outcome);
    if (!recorded) return log.debug('delivery changed meanwhile (endpoint deleted?); outcome dropped');
    if (outcome.state === 'delivered') log.debug({ status: outcome.status }, 'webhook delivered');
    else log.info({ status: outcome.status, error: outcome.error, state: outcome.state }, 'webhook attempt failed');
  }

  private outcome(result: Exclude<AttemptResult, { kind: 'aborted' }>, attemptsMade: number): AttemptRecord {
    if (result.kind === 'response' && result.status >= 200 && result.status < 300) return { state: 'delivered', status: result.status };
    const status = result.kind === 'response' ? result.status : null;
    const error = result.kind === 'response' ? describeStatus(result.status) : result.message;
    const permanent = result.kind === 'error' && result.permanent;
    const { maxAttempts, retryBaseMs, retryMaxMs } = this.deps.settings;
    const retryInMs = permanent ? null : retryDelayMs(attemptsMade, { maxAttempts, baseMs: retryBaseMs, maxMs: retryMaxMs });
    return retryInMs === null ? { state: 'failed', status, error } : { state: 'pending', status, error, retryInMs };
  }
}
