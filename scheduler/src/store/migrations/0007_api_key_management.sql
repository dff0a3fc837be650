-- Keys created through POST /v1/keys carry an optional name and the first characters of the key
-- (enough to recognize it in a list, not to use it); keys made before have neither. last_used_at
-- is written at most once a minute per key and replica.
ALTER TABLE api_keys ADD COLUMN name text;
ALTER TABLE api_keys ADD COLUMN prefix text;
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz;
CREATE INDEX api_keys_org ON api_keys (org_id, created_at) WHERE revoked_at IS NULL;

-- Replicas cache key lookups and drop an entry when its row changes; recording use must not
-- empty every replica's cache once a minute, so only what a lookup reads counts as a change.
DROP TRIGGER api_keys_changed ON api_keys;
CREATE TRIGGER api_keys_changed AFTER UPDATE ON api_keys
  FOR EACH ROW WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at OR OLD.org_id IS DISTINCT FROM NEW.org_id
                     OR OLD.token_hash IS DISTINCT FROM NEW.token_hash)
  EXECUTE FUNCTION canto_notify_changed('canto_api_key_changed', 'token_hash');
CREATE TRIGGER api_keys_deleted AFTER DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_api_key_changed', 'token_hash');
