/**
 * Schema migrations, applied in order at scheduler start. Each entry runs once, inside a
 * transaction holding an advisory lock, so several schedulers starting together on one database
 * do not race. Migrations are append-only: never edit one that has shipped.
 */
import { inTransaction, type Sql } from './db.js';

const MIGRATIONS: ReadonlyArray<{ id: number; name: string; sql: string }> = [
  {
    id: 1,
    name: 'foundation',
    sql: `
CREATE TABLE orgs (
  id text PRIMARY KEY,
  name text NOT NULL UNIQUE,
  created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
  id text PRIMARY KEY,
  org_id text NOT NULL REFERENCES orgs(id),
  token_hash text NOT NULL UNIQUE,
  created_at timestamptz NOT NULL DEFAULT now(),
  revoked_at timestamptz
);

CREATE TABLE hosts (
  id text PRIMARY KEY,
  hostname text NOT NULL,
  agent_instance_id text NOT NULL,
  protocol text NOT NULL,
  runtime text NOT NULL,
  memory_snapshots boolean NOT NULL,
  vcpus integer NOT NULL,
  memory_mb integer NOT NULL,
  status text NOT NULL CHECK (status IN ('ready', 'down')),
  cordoned boolean NOT NULL DEFAULT false,
  last_seen_at timestamptz NOT NULL DEFAULT now(),
  created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE desktops (
  id text PRIMARY KEY,
  org_id text NOT NULL REFERENCES orgs(id),
  tier text NOT NULL CHECK (tier IN ('small', 'default', 'large')),
  state text NOT NULL CHECK (state IN ('provisioning', 'waking', 'awake', 'hibernating', 'hibernated', 'destroyed')),
  image_version text NOT NULL,
  generation integer NOT NULL DEFAULT 0,
  current_generation_id text NOT NULL,
  idle_timeout_secs integer NOT NULL CHECK (idle_timeout_secs >= 0),
  billing_mode text NOT NULL CHECK (billing_mode IN ('monthly', 'hourly')),
  host_id text REFERENCES hosts(id),
  env_sealed bytea,
  setup_script_sealed bytea,
  created_event_at timestamptz,
  first_woken_at timestamptz,
  last_woken_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  destroyed_at timestamptz
);
CREATE INDEX desktops_org_state ON desktops (org_id, state);
CREATE INDEX desktops_host ON desktops (host_id) WHERE state <> 'destroyed';

CREATE TABLE desktop_idempotency (
  org_id text NOT NULL REFERENCES orgs(id),
  key text NOT NULL,
  desktop_id text NOT NULL REFERENCES desktops(id),
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, key)
);

CREATE TABLE operations (
  id text PRIMARY KEY,
  org_id text NOT NULL REFERENCES orgs(id),
  desktop_id text NOT NULL REFERENCES desktops(id),
  kind text NOT NULL CHECK (kind IN ('wake', 'hibernate', 'destroy', 'fork')),
  state text NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
  idempotency_key text,
  -- The state the desktop left when the operation was accepted; a failed wake returns to it.
  from_state text NOT NULL,
  reason text NOT NULL DEFAULT 'requested',
  result jsonb,
  error jsonb,
  attempts integer NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  settled_at timestamptz,
  UNIQUE (desktop_id, idempotency_key)
);
CREATE INDEX operations_open ON operations (created_at) WHERE state IN ('pending', 'running');

CREATE TABLE outbox (
  id bigserial PRIMARY KEY,
  org_id text NOT NULL REFERENCES orgs(id),
  desktop_id text NOT NULL,
  type text NOT NULL,
  payload jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  dispatched_at timestamptz
);

CREATE TABLE meter_intervals (
  id bigserial PRIMARY KEY,
  org_id text NOT NULL REFERENCES orgs(id),
  desktop_id text NOT NULL REFERENCES desktops(id),
  started_at timestamptz NOT NULL,
  ended_at timestamptz
);
CREATE UNIQUE INDEX meter_one_open ON meter_intervals (desktop_id) WHERE ended_at IS NULL;
CREATE INDEX meter_org ON meter_intervals (org_id, started_at);

CREATE TABLE leases (
  name text PRIMARY KEY,
  holder text NOT NULL,
  expires_at timestamptz NOT NULL
);
`,
  },
  {
    id: 2,
    name: 'forks',
    sql: `
-- Parameters an operation needs beyond its desktop: for fork, the count, ephemeral flag and the
-- ids minted for the forks up front, so a re-driven fork creates the same desktops.
ALTER TABLE operations ADD COLUMN params jsonb;
-- Ephemeral forks are destroyed, not hibernated, at their idle timeout.
ALTER TABLE desktops ADD COLUMN ephemeral boolean NOT NULL DEFAULT false;
ALTER TABLE desktops ADD COLUMN forked_from text REFERENCES desktops(id);
`,
  },
  {
    id: 3,
    name: 'webhooks',
    sql: `
CREATE TABLE webhook_endpoints (
  id text PRIMARY KEY,
  org_id text NOT NULL REFERENCES orgs(id),
  url text NOT NULL,
  events text[] NOT NULL,
  -- The signing secret, sealed with the scheduler's secret key (context: the endpoint id).
  secret_sealed bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_org ON webhook_endpoints (org_id, created_at);

CREATE TABLE webhook_deliveries (
  id text PRIMARY KEY,
  -- The delivery log's order (newest first) and the per-desktop order of attempts.
  seq bigserial NOT NULL UNIQUE,
  endpoint_id text NOT NULL REFERENCES webhook_endpoints(id) ON DELETE CASCADE,
  outbox_id bigint NOT NULL REFERENCES outbox(id),
  desktop_id text NOT NULL,
  event_type text NOT NULL,
  -- The exact bytes POSTed (and signed) on every attempt.
  body text NOT NULL,
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
  attempts integer NOT NULL DEFAULT 0,
  last_status integer,
  last_error text,
  -- Due time while pending (pushed forward by a claim's lease); null once settled.
  next_attempt_at timestamptz DEFAULT now(),
  created_at timestamptz NOT NULL DEFAULT now(),
  delivered_at timestamptz,
  UNIQUE (outbox_id, endpoint_id)
);
CREATE INDEX webhook_deliveries_log ON webhook_deliveries (endpoint_id, seq DESC);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_queue ON webhook_deliveries (endpoint_id, desktop_id, seq) WHERE state = 'pending';

CREATE INDEX outbox_undispatched ON outbox (id) WHERE dispatched_at IS NULL;

-- Wakes the leader's dispatcher when an event commits (one notification per transaction).
CREATE FUNCTION canto_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('canto_outbox', '');
  RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION canto_outbox_notify();
`,
  },
  {
    id: 4,
    name: 'ports',
    sql: `
CREATE TABLE port_exposures (
  id text PRIMARY KEY,
  org_id text NOT NULL REFERENCES orgs(id),
  -- Desktops are destroyed, not deleted, today; were one ever deleted, its exposures go with it.
  desktop_id text NOT NULL REFERENCES desktops(id) ON DELETE CASCADE,
  port integer NOT NULL CHECK (port BETWEEN 1 AND 65535),
  public boolean NOT NULL,
  -- sha256 hex of the private exposure's token (svc_pt_…); null for a public exposure.
  token_hash text,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (desktop_id, port),
  CHECK (public = (token_hash IS NULL))
);

-- Where the host's port gateway listens ("host:port"), from the agent's hello; null when the
-- agent reports none (port exposures are off on that host).
ALTER TABLE hosts ADD COLUMN ingress_address text;
`,
  },
  {
    id: 5,
    name: 'change notifications',
    sql: `
-- Each replica caches API key, org and desktop lookups (store/notified-cache.ts) and its ingress
-- closes what a deleted port exposure carried (services/ports.ts), whichever replica changed the
-- row. One trigger function serves all: its arguments are the channel, then the columns of the
-- old row whose values, joined by ':', are the payload. NOTIFY is delivered at commit, once per
-- distinct payload.
CREATE FUNCTION canto_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  old_row jsonb := to_jsonb(OLD);
  payload text := old_row ->> TG_ARGV[1];
BEGIN
  FOR i IN 2 .. TG_NARGS - 1 LOOP
    payload := payload || ':' || (old_row ->> TG_ARGV[i]);
  END LOOP;
  PERFORM pg_notify(TG_ARGV[0], payload);
  RETURN NULL;
END $$;
CREATE TRIGGER api_keys_changed AFTER UPDATE OR DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_api_key_changed', 'token_hash');
CREATE TRIGGER orgs_changed AFTER UPDATE OR DELETE ON orgs
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_org_changed', 'name');
CREATE TRIGGER desktops_changed AFTER UPDATE OR DELETE ON desktops
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_desktop_changed', 'id');
CREATE TRIGGER port_exposures_deleted AFTER DELETE ON port_exposures
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_port_exposure_deleted', 'desktop_id', 'port');
`,
  },
  {
    id: 6,
    name: 'fleet',
    sql: `
-- Every term of a lease gets the next epoch: a new holder, or a holder taking it back after it
-- lapsed. The leader's lifecycle commands carry it, and agents refuse a command of an older term
-- (a deposed leader's late one). Releasing a lease expires it instead of deleting the row, so the
-- count never starts again.
ALTER TABLE leases ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN term_started_at timestamptz NOT NULL DEFAULT now();

-- The scheduler replicas: each refreshes its row every second while it runs. Agents learn the
-- advertised URLs from any replica and keep a link to each; \`canto status\` lists them and
-- compares the settings that must match (fingerprints only, never the values of secrets).
CREATE TABLE replicas (
  id text PRIMARY KEY,
  url text NOT NULL,
  version text NOT NULL,
  settings jsonb NOT NULL DEFAULT '{}',
  started_at timestamptz NOT NULL DEFAULT now(),
  last_seen_at timestamptz NOT NULL DEFAULT now()
);

-- When a host was last heard from before its agent restarted: a desktop found gone at the
-- relink is billed until then, not until the relink.
ALTER TABLE hosts ADD COLUMN previous_seen_at timestamptz;
`,
  },
  {
    id: 7,
    name: 'api key management',
    sql: `
-- Keys created through POST /v1/keys carry an optional name and the first characters of the key
-- (enough to recognize it in a list, not to use it); keys made before have neither. last_used_at
-- is written at most once a minute per key and replica.
ALTER TABLE api_keys ADD COLUMN name text;
ALTER TABLE api_keys ADD COLUMN prefix text;
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz;
CREATE INDEX api_keys_org ON api_keys (org_id, created_at) WHERE revoked_at IS NULL;

-- Replicas cache key lookups and drop an entry when its row changes; recording use must not
-- empty every replica's cache once a minute, so only what a lookup reads counts as a change.
DROP TRIGGER api_keys_changed ON api_keys;
CREATE TRIGGER api_keys_changed AFTER UPDATE ON api_keys
  FOR EACH ROW WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at OR OLD.org_id IS DISTINCT FROM NEW.org_id
                     OR OLD.token_hash IS DISTINCT FROM NEW.token_hash)
  EXECUTE FUNCTION canto_notify_changed('canto_api_key_changed', 'token_hash');
CREATE TRIGGER api_keys_deleted AFTER DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_api_key_changed', 'token_hash');
`,
  },
  {
    id: 8,
    name: 'moves and drains',
    sql: `
-- A move carries a desktop's disk (and memory snapshot) to another host: a durable operation like
-- the others, driven by the leader, its progress in params.
ALTER TABLE operations DROP CONSTRAINT operations_kind_check;
ALTER TABLE operations ADD CONSTRAINT operations_kind_check CHECK (kind IN ('wake', 'hibernate', 'destroy', 'fork', 'move'));
-- While set, the desktop is between hosts: guest calls answer 503 with Retry-After, lifecycle
-- requests 409. Cleared when the move commits or rolls back.
ALTER TABLE desktops ADD COLUMN moving_operation_id text;
-- A drain: cordoned, and every desktop moved off, drain_parallel at a time. Finished when the host
-- holds none; drain_error says why it stopped short.
ALTER TABLE hosts ADD COLUMN drain_requested_at timestamptz;
ALTER TABLE hosts ADD COLUMN drain_parallel integer;
ALTER TABLE hosts ADD COLUMN drain_finished_at timestamptz;
ALTER TABLE hosts ADD COLUMN drain_error text;
-- Where other agents fetch a moved desktop from (protocol 1.8 hello transfer), host:port.
ALTER TABLE hosts ADD COLUMN transfer_address text;
`,
  },
];

// Ids are applied once each, in order: two entries with one id would skip the second for ever.
for (let i = 1; i < MIGRATIONS.length; i++) {
  if (MIGRATIONS[i]!.id <= MIGRATIONS[i - 1]!.id) throw new Error(`migration ids must increase: ${MIGRATIONS[i]!.id} after ${MIGRATIONS[i - 1]!.id}`);
}

const LOCK_KEY = 0x63616e74; // "cant"

export async function migrate(sql: Sql): Promise<number> {
  let applied = 0;
  await inTransaction(sql, async (tx) => {
    await tx`SELECT pg_advisory_xact_lock(${LOCK_KEY})`;
    await tx`CREATE TABLE IF NOT EXISTS schema_migrations (id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`;
    const done = new Set((await tx<{ id: number }[]>`SELECT id FROM schema_migrations`).map((r) => r.id));
    for (const m of MIGRATIONS) {
      if (done.has(m.id)) continue;
      await tx.unsafe(m.sql);
      await tx`INSERT INTO schema_migrations (id, name) VALUES (${m.id}, ${m.name})`;
      applied++;
    }
  });
  return applied;
}

/** Null when the database carries every migration this build knows; else what is missing. */
export async function schemaProblem(sql: Sql): Promise<string | null> {
  const latest = MIGRATIONS[MIGRATIONS.length - 1]!.id;
  const [row] = await sql<{ id: number | null }[]>`SELECT max(id) AS id FROM schema_migrations`;
  const applied = row?.id ?? 0;
  return applied >= latest ? null : `database schema is at migration ${applied}, this build needs ${latest}`;
}
