-- A host an operator declared lost for good (POST /admin/v1/hosts/{id}/forget): its disks are
-- gone with it, so the desktops recorded there are destroyed without it and the host is removed
-- once it holds none. Until then its agent's hellos are refused: a lost host that comes back must
-- not take work while its desktops are written off.
ALTER TABLE hosts ADD COLUMN lost_at timestamptz;
