/**
 * The names the guests' /etc view remembers (agent/src/runtime/sandbox/host/etc-view.ts,
 * `etc-view/names.json`): a file torn by a power loss, or otherwise unreadable, is written anew
 * and the view is mounted; it used to turn the view off at every start, leaving guests the host's
 * /etc with covers a rename undoes. Needs root.
 */
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { ETC_VIEW_DIR, etcSourceFor } from '../../agent/src/runtime/sandbox/host/etc-view.js';
import { isRoot } from '../helpers/sandbox.js';

describe.skipIf(!isRoot)("the /etc view's remembered names", () => {
  let stateDir: string | null = null;
  let driver: SandboxDriver | null = null;

  afterAll(async () => {
    await driver?.close();
    if (stateDir) await rm(stateDir, { recursive: true, force: true });
  });

  it('mounts the view over a torn record, and writes the record anew', async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'canto-etc-names-'));
    await mkdir(join(stateDir, ETC_VIEW_DIR), { recursive: true });
    await writeFile(join(stateDir, ETC_VIEW_DIR, 'names.json'), '["/etc/shad');
    driver = await createSandboxDriver({ stateDir, memorySnapshots: false, goldenTemplates: false });
    expect(etcSourceFor(join(stateDir, 'desktops', 'dsk_000000000000000000000000'))).not.toBe('/etc');
    const names = JSON.parse(await readFile(join(stateDir, ETC_VIEW_DIR, 'names.json'), 'utf8')) as string[];
    expect(names).toContain('/etc/shadow');
  });
});
