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
