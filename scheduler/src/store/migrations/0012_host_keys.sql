-- Each host's key (agent/src/host-identity.ts): the SHA-256 of the first key a host id said hello
-- with. A hello naming that id with another key, or with none, is refused, so the join token every
-- agent holds lets no one take over another host's id. NULL for a host whose agent never sent
-- one (older than protocol 1.15); its next hello with a key records it.
ALTER TABLE hosts ADD COLUMN host_key_hash text;
