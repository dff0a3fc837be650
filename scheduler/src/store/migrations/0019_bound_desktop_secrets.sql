-- Whether a desktop's sealed env and setup script are bound to their org and field (associated
-- data of the seal: crypto/desktop-secrets.ts). Rows sealed before are false until a scheduler
-- start seals them again, bound.
ALTER TABLE desktops ADD COLUMN secrets_bound boolean NOT NULL DEFAULT false;
