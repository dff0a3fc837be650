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
