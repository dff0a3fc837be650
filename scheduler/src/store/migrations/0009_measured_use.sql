-- What the host's agent last measured of its use (protocol 1.11 heartbeats): placement admits by
-- measured memory beside the nominal tier sizes. Null until the agent reports it (and from agents
-- older than 1.11), and cleared at each hello: a new agent instance measures afresh.
ALTER TABLE hosts ADD COLUMN measured_at timestamptz;
ALTER TABLE hosts ADD COLUMN running_desktops integer;
ALTER TABLE hosts ADD COLUMN memory_available_mb integer;
ALTER TABLE hosts ADD COLUMN desktops_memory_mb integer;
ALTER TABLE hosts ADD COLUMN cpu_busy real;
