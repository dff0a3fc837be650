-- Which hosts each replica's agent links are up to, as of its last registry refresh, so an SRE
-- sees a partial partition (a host the followers reach and the leader does not). NULL: a replica
-- of an older version, which does not say.
ALTER TABLE replicas ADD COLUMN linked_hosts text[];
