-- The copies a failed fork may have left on its source's host are swept when the host next says
-- hello (engine/stale-copies.ts): the only record of their ids is the failed operation's params.
-- This index keeps that look-up to the failed forks, not every operation ever run.
CREATE INDEX operations_failed_forks ON operations (id) WHERE kind = 'fork' AND state = 'failed';
