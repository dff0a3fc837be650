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
