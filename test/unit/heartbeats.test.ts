/**
 * Heartbeats never wait for the desktop count: a driver whose listing is slow (its file-system
 * calls queued behind a move's copy) must not make a healthy host read silent to the schedulers.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { Heartbeats, type BeatingLink } from '../../agent/src/heartbeats.js';
import type { RuntimeDriver } from '../../agent/src/runtime/driver.js';
import { silentLogger } from '../../shared/src/log.js';

function fakeLink(): BeatingLink & { beats: Array<{ at: number; running: number }> } {
  const beats: Array<{ at: number; running: number }> = [];
  return {
    beats,
    ws: { ping: () => undefined, terminate: () => undefined } as unknown as BeatingLink['ws'],
    peer: { isOpen: true, notify: (_type: string, payload: { running_desktops: number }) => beats.push({ at: Date.now(), running: payload.running_desktops }) } as unknown as BeatingLink['peer'],
    lastSeenAt: Date.now(),
    label: {},
  };
}

let heartbeats: Heartbeats | null = null;
afterEach(() => heartbeats?.stop());

describe('Heartbeats', () => {
  it('beats on time while listing desktops takes longer than several intervals', async () => {
    let running = 0;
    let release: () => void = () => undefined;
    const driver = {
      // The first listing answers at once; later ones hang until released.
      list: async () => {
        if (running++ > 0) await new Promise<void>((r) => (release = r));
        return [{ desktopId: 'dsk_x', running: true, hasSnapshot: false }];
      },
    } as unknown as RuntimeDriver;
    const link = fakeLink();
    heartbeats = new Heartbeats(driver, () => [link], silentLogger());
    const started = Date.now();
    await heartbeats.start(20, link);
    await new Promise((r) => setTimeout(r, 300));
    // About fifteen intervals passed with the listing stuck: every one of them beat.
    expect(link.beats.length).toBeGreaterThanOrEqual(10);
    const gaps = link.beats.slice(1).map((b, i) => b.at - link.beats[i]!.at);
    expect(Math.max(...gaps), `gaps ${gaps.join(',')} since ${started}`).toBeLessThan(150);
    // They carry the last count read.
    expect(link.beats.at(-1)!.running).toBe(1);
    release();
  });
});
