/**
 * The engine's background placements in rounds (engine/steps.ts `PlacementRound`), on a real
 * Postgres: when no host has room, a round reads the fleet once per tier, not once per desktop
 * (each read a snapshot transaction of four queries), and every desktop of that tier is told the
 * same reason. A tier the round has not tried still reads the fleet. Each round is offered the
 * oldest waiting desktops of every tier, so a tier no host can take never starves the others.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { insertDesktop, provisioningDesktops } from '../../scheduler/src/store/desktops.js';
import { ensureOrg } from '../../scheduler/src/store/orgs.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { NoCapacity, provision, type PlacementRound, type StepDeps } from '../../scheduler/src/engine/steps.js';
import { PlacementReservations } from '../../scheduler/src/placement/reservations.js';
import type { Tier } from '../../shared/src/tiers.js';
import { newId } from '../../shared/src/ids.js';
import { silentLogger } from '../../shared/src/log.js';
import { freshDatabaseUrl } from '../helpers/db.js';

let sql: Sql;
/** Snapshot reads of the fleet (placement's `readFleet`) made through `counted`. */
let fleetReads = 0;
let counted: Sql;

beforeAll(async () => {
  sql = connectDatabase(await freshDatabaseUrl(), { max: 4 });
  counted = new Proxy(sql, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver) as unknown;
      if (prop !== 'begin' || typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        if (typeof args[0] === 'string' && args[0].includes('repeatable read')) fleetReads++;
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
});

afterAll(async () => {
  await sql?.end();
});

function deps(): StepDeps {
  const config = loadSchedulerConfig({ DATABASE_URL: 'postgres://x', CANTO_SECRET_KEY: 'x' });
  return {
    sql: counted,
    agents: { isConnected: () => false, speaks: () => true } as unknown as StepDeps['agents'],
    secrets: null as unknown as StepDeps['secrets'],
    logger: silentLogger(),
    fence: { holder: 'test', epoch: 1 },
    leading: () => true,
    agentCommandTimeoutMs: 1_000,
    hostWaitMs: 0,
    placement: config.placement,
    hostSlots: config.hostSlots,
    placements: new PlacementReservations(),
  };
}

async function provisioning(orgId: string, tier: Tier, n: number) {
  return Promise.all(Array.from({ length: n }, () => insertDesktop(sql, {
    orgId, tier, imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null,
  })));
}

describe('placement rounds', () => {
  it('reads the fleet once per tier when no host has room, and tells each desktop why', async () => {
    const orgId = await ensureOrg(sql, `round-${newId('org')}`);
    // A host that is down: nothing can be placed.
    await sql`
      INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status, last_seen_at)
      VALUES (${newId('host')}, 'h', 'i', '1.13', 'sandbox', true, 2, 4096, 'down', now())`;
    const small = await provisioning(orgId, 'small', 10);
    const d = deps();

    const round: PlacementRound = { noRoom: new Map() };
    fleetReads = 0;
    const outcomes = await Promise.allSettled(small.map((desktop) => provision(d, desktop, round)));
    expect(fleetReads).toBe(1);
    const reasons = outcomes.map((o) => (o.status === 'rejected' && o.reason instanceof NoCapacity ? o.reason.message : 'placed'));
    expect(new Set(reasons)).toEqual(new Set(['no host is up to take a small desktop']));
    expect(d.placements.size).toBe(0);

    // Another tier in the same round reads the fleet for itself.
    const [large] = await provisioning(orgId, 'large', 1);
    await expect(provision(d, large!, round)).rejects.toBeInstanceOf(NoCapacity);
    expect(fleetReads).toBe(2);

    // Without a round (a wake placing its own desktop) each placement reads the fleet.
    fleetReads = 0;
    await Promise.allSettled(small.slice(0, 3).map((desktop) => provision(d, desktop)));
    expect(fleetReads).toBe(3);
  });

  it('offers each round the oldest desktops of every tier, so a tier no host can take does not hold the others back', async () => {
    await sql`UPDATE desktops SET state = 'destroyed' WHERE state = 'provisioning'`;
    const orgId = await ensureOrg(sql, `queue-${newId('org')}`);
    // More large desktops than a round takes, all older than the small one.
    await provisioning(orgId, 'large', 25);
    const [small] = await provisioning(orgId, 'small', 1);
    const offered = await provisioningDesktops(sql, 20);
    expect(offered.map((x) => x.id)).toContain(small!.id);
    expect(offered.filter((x) => x.tier === 'large')).toHaveLength(20);
    // Oldest first, whatever the tier.
    expect(offered.map((x) => x.created_at.getTime())).toEqual(offered.map((x) => x.created_at.getTime()).sort((a, b) => a - b));
  });
});
