/**
 * What the driver lists (agent/src/runtime/sandbox/host/desktop-status.ts), read from desktop
 * directories made by hand: a desktop counts once it has a disk, runs while its recorded guest
 * init is alive (this test process stands in for one), and a template is no desktop.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { desktopStatus, listDesktops } from '../../agent/src/runtime/sandbox/host/desktop-status.js';
import { procStatSync } from '../../agent/src/runtime/sandbox/host/host-procs.js';
import { TEMPLATE_FILE } from '../../agent/src/runtime/sandbox/host/layout.js';

let stateDir: string;

beforeEach(() => {
  stateDir = mkdtempSync(join(tmpdir(), 'canto-status-'));
});

afterEach(() => {
  rmSync(stateDir, { recursive: true, force: true });
});

/** A desktop directory: with a disk unless told, an init record, a snapshot, a template mark. */
function desktop(id: string, parts: { disk?: boolean; init?: { pid: number; startTime: string }; snapshot?: boolean; template?: boolean }): void {
  const dir = join(stateDir, 'desktops', id);
  mkdirSync(join(dir, 'run'), { recursive: true });
  if (parts.disk !== false) writeFileSync(join(dir, '.ready'), '');
  if (parts.init) writeFileSync(join(dir, 'run', 'init.json'), JSON.stringify(parts.init));
  if (parts.snapshot) mkdirSync(join(dir, 'snapshot'));
  if (parts.template) writeFileSync(join(dir, TEMPLATE_FILE), '{}');
}

describe('listDesktops', () => {
  it('lists desktops with a disk, running while their init lives, and leaves templates and strays out', async () => {
    const self = procStatSync(process.pid)!;
    const ids = Array.from({ length: 250 }, (_, i) => `dsk_${String(i).padStart(24, '0')}`);
    for (const [i, id] of ids.entries()) {
      if (i === 0) desktop(id, { init: { pid: process.pid, startTime: self.startTime } });
      else if (i === 1) desktop(id, { init: { pid: process.pid, startTime: '1' }, snapshot: true });
      else if (i === 2) desktop(id, { disk: false });
      else if (i === 3) desktop(id, { template: true });
      else desktop(id, {});
    }
    mkdirSync(join(stateDir, 'desktops', 'not-a-desktop'));
    const listed = await listDesktops(stateDir);
    expect(listed).toHaveLength(248);
    expect(listed[0]).toEqual({ desktopId: ids[0], running: true, hasSnapshot: false });
    expect(listed[1]).toEqual({ desktopId: ids[1], running: false, hasSnapshot: true });
    expect(listed.map((d) => d.desktopId)).not.toContain(ids[2]);
    expect(listed.map((d) => d.desktopId)).not.toContain(ids[3]);
    expect(listed.filter((d) => d.running)).toHaveLength(1);
    expect(desktopStatus(stateDir, ids[2]!)).toBeNull();
  });

  it('answers an empty list where there is no desktops directory', async () => {
    expect(await listDesktops(join(stateDir, 'nothing'))).toEqual([]);
  });
});
