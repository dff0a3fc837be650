/**
 * `canto status` warnings (cli/src/status.ts): a down host is named while it holds any desktop,
 * hibernated ones included (their disks are there alone), not only while some are awake; a host
 * declared lost says what is left of its forgetting.
 */
import { describe, expect, it } from 'vitest';
import { fleetWarnings, hostStatusLabel, type FleetStatus } from '../../cli/src/status.js';
import type { ReplicaRow } from '../../scheduler/src/store/replicas.js';

const replica: ReplicaRow = { id: 'r1', url: 'http://a', version: '1', settings: {}, started_at: new Date(), last_seen_at: new Date(), linked_hosts: [] };

function fleet(hosts: Array<{ status: string; desktops: Record<string, number>; lost?: boolean }>): FleetStatus {
  return {
    now: new Date().toISOString(),
    lease: { holder: 'r1', epoch: 1, held_for_ms: 1000, expires_in_ms: 1000, live: true },
    replicas: [],
    hosts: hosts.map((h, i) => ({
      id: `host_${i}`, hostname: `h${i}`, cordoned: false, last_heard_ms_ago: 0, runtime: 'sandbox', protocol: '1.15', drain: null, lost: false,
      links: { linked: ['r1'], unlinked: [], settling: [], leader: 'r1', leader_linked: true }, unrecorded: null, ...h,
    })),
    stuck_operations: [],
    warnings: [],
  };
}

describe('fleet warnings', () => {
  it('names a down host while it holds desktops, hibernated ones too', () => {
    const warnings = fleetWarnings(
      fleet([
        { status: 'down', desktops: { hibernated: 3 } },
        { status: 'down', desktops: { awake: 1, hibernated: 1 } },
        { status: 'down', desktops: {} },
        { status: 'ready', desktops: { awake: 2 } },
        { status: 'down', desktops: { hibernated: 4 }, lost: true },
      ]),
      [replica],
    );
    expect(warnings).toEqual([
      'host host_0 (h0) is down with 3 desktop(s) on it: they cannot wake until it returns',
      'host host_1 (h1) is down with 2 desktop(s) on it: they cannot wake until it returns',
      // A host declared lost is being written off: what is left to do, not that it is down.
      'host host_4 (h4) was declared lost: 4 desktop(s) on it still to destroy; finish with canto hosts forget host_4 --yes --wait',
    ]);
  });

  it('labels a host being forgotten lost, whatever else it was, in canto status and hosts list alike', () => {
    expect(hostStatusLabel('down', true, 'stopped', true)).toBe('lost');
    expect(hostStatusLabel('down', true, 'stopped')).toBe('down,cordoned,drain stopped');
  });
});
