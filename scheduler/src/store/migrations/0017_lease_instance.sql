-- Which process holds a lease, beside which replica: two processes started with one replica id
-- (a restart while the old one was frozen, not dead) must not share a term (store/leases.ts).
ALTER TABLE leases ADD COLUMN instance text;
