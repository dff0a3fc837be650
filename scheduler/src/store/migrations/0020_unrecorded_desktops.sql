-- Since when the host's heartbeats have counted more running desktops than the records let run
-- there (awake, waking, hibernating, or the target of an open move); NULL while they agree. A
-- desktop running unrecorded runs unbilled and out of sight: `canto status` warns past a minute.
ALTER TABLE hosts ADD COLUMN unrecorded_since timestamptz;
