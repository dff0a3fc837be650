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
