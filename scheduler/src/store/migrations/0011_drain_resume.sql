-- A drain stopped by a move that failed is resumed by asking for the drain again. It keeps its
-- start (drain_requested_at: the key its moves carry, so what it moved still counts), and from the
-- resume on only moves that fail after it stop it again: the failure that stopped it is not
-- counted a second time. NULL while the drain was never resumed.
ALTER TABLE hosts ADD COLUMN drain_resumed_at timestamptz;
