-- Each replica caches API key, org and desktop lookups (store/notified-cache.ts) and its ingress
-- closes what a deleted port exposure carried (services/ports.ts), whichever replica changed the
-- row. One trigger function serves all: its arguments are the channel, then the columns of the
-- old row whose values, joined by ':', are the payload. NOTIFY is delivered at commit, once per
-- distinct payload.
CREATE FUNCTION canto_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  old_row jsonb := to_jsonb(OLD);
  payload text := old_row ->> TG_ARGV[1];
BEGIN
  FOR i IN 2 .. TG_NARGS - 1 LOOP
    payload := payload || ':' || (old_row ->> TG_ARGV[i]);
  END LOOP;
  PERFORM pg_notify(TG_ARGV[0], payload);
  RETURN NULL;
END $$;
CREATE TRIGGER api_keys_changed AFTER UPDATE OR DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_api_key_changed', 'token_hash');
CREATE TRIGGER orgs_changed AFTER UPDATE OR DELETE ON orgs
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_org_changed', 'name');
CREATE TRIGGER desktops_changed AFTER UPDATE OR DELETE ON desktops
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_desktop_changed', 'id');
CREATE TRIGGER port_exposures_deleted AFTER DELETE ON port_exposures
  FOR EACH ROW EXECUTE FUNCTION canto_notify_changed('canto_port_exposure_deleted', 'desktop_id', 'port');
