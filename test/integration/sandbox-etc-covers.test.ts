/**
 * A memory snapshot whose guest lacks a cover of a host secret in /etc (dumped before the covers
 * existed, or on a host without that secret) is not restored: the desktop boots cold, with every
 * cover this host requires, and the runtime warns why. Its disk is kept; its programs end.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { detectCriu } from '../../agent/src/runtime/sandbox/host/criu.js';
import { maskedHostPaths } from '../../agent/src/runtime/sandbox/guest/guest-init.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';

const criu = isRoot ? await detectCriu(undefined) : null;

describe.skipIf(criu === null)('a memory snapshot without the covers of host secrets', () => {
  const id = newId('desktop');
  const logged: string[] = [];
  let base: string;
  let driver: SandboxDriver;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-etc-covers-'));
    const log = (msg: string, fields?: object, level?: 'warn') => void logged.push(`${level ?? 'info'}: ${msg} ${JSON.stringify(fields ?? {})}`);
    driver = await createSandboxDriver({ stateDir: join(base, 'state'), log, goldenTemplates: false });
  });

  afterAll(async () => {
    await driver?.close();
    await destroyLeftDesktops(join(base, 'state'));
    await rm(base, { recursive: true, force: true });
  });

  it('boots cold, covered, instead of restoring a guest that could read them', async () => {
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    await driver.exec(id, { command: 'echo kept > /root/note', timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    // What an image dumped before /etc/shadow was covered says of its mounts.
    const externalsFile = join(base, 'state', 'desktops', id, 'snapshot', 'externals.json');
    const externals = JSON.parse(await readFile(externalsFile, 'utf8')) as Array<{ guestPath: string }>;
    expect(externals.map((e) => e.guestPath)).toEqual(expect.arrayContaining(maskedHostPaths().files));
    await writeFile(externalsFile, JSON.stringify(externals.filter((e) => e.guestPath !== '/etc/shadow')));

    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(false);
    expect(logged.filter((line) => line.startsWith('warn: restore failed; booting cold') && line.includes('/etc/shadow'))).toHaveLength(1);
    const read = await driver.exec(id, { command: 'cat /etc/shadow | wc -c; cat /root/note', timeoutMs: 10_000, maxOutputBytes: 1000 });
    expect(read.stdout).toBe('0\nkept\n');
    await driver.destroy(id);
  }, 60_000);
});
