-- When the host's current agent instance first said hello. A desktop its relinked host no longer
-- runs is billed until the previous agent was last heard from (`previous_seen_at`) only on the
-- relink that follows that agent's restart: on a later relink or failover, its guest may have
-- died any time since, and `previous_seen_at` says nothing about when (engine/steps.ts reconcileAwake).
ALTER TABLE hosts ADD COLUMN instance_since timestamptz;
