-- The engine reads the desktops waiting for a host on every tick, the oldest of each tier
-- (store/desktops.ts provisioningDesktops): only those rows, in that order, without a scan of
-- every desktop. The index stays as small as the queue.
CREATE INDEX desktops_provisioning ON desktops (tier, created_at) WHERE state = 'provisioning';
