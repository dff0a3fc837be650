-- Parameters an operation needs beyond its desktop: for fork, the count, ephemeral flag and the
-- ids minted for the forks up front, so a re-driven fork creates the same desktops.
ALTER TABLE operations ADD COLUMN params jsonb;
-- Ephemeral forks are destroyed, not hibernated, at their idle timeout.
ALTER TABLE desktops ADD COLUMN ephemeral boolean NOT NULL DEFAULT false;
ALTER TABLE desktops ADD COLUMN forked_from text REFERENCES desktops(id);
