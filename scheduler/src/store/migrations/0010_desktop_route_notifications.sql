-- Each replica caches awake desktops' routes (store/notified-cache.ts). Until now a change of a
-- desktop row only named the row, so the cache dropped the route, and the first guest call after
-- every wake read the row again. This notification carries what a route is made of, as the
-- change left it: the cache takes it as the new route (an awake desktop's first call reads no
-- row) or drops the old one. A deleted row sends its id alone. The `desktops_changed` trigger
-- stays for replicas of the previous version during a rolling upgrade, which still listen to it.
CREATE FUNCTION canto_notify_desktop_route() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    PERFORM pg_notify('canto_desktop_route', json_build_object('id', OLD.id)::text);
  ELSE
    PERFORM pg_notify('canto_desktop_route', json_build_object(
      'id', NEW.id, 'org_id', NEW.org_id, 'state', NEW.state, 'host_id', NEW.host_id,
      'generation', NEW.generation, 'moving', NEW.moving_operation_id IS NOT NULL)::text);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER desktops_route_changed AFTER UPDATE OR DELETE ON desktops
  FOR EACH ROW EXECUTE FUNCTION canto_notify_desktop_route();
