-- Every term of a lease gets the next epoch: a new holder, or a holder taking it back after it
-- lapsed. The leader's lifecycle commands carry it, and agents refuse a command of an older term
-- (a deposed leader's late one). Releasing a lease expires it instead of deleting the row, so the
-- count never starts again.
ALTER TABLE leases ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN term_started_at timestamptz NOT NULL DEFAULT now();

-- The scheduler replicas: each refreshes its row every second while it runs. Agents learn the
-- advertised URLs from any replica and keep a link to each; `canto status` lists them and
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
