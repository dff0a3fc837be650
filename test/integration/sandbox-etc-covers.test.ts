/**
 * A guest reads nothing of the host's /etc that only the host's root may read (guest/etc-secrets.ts):
 * the agent's join token in /etc/canto/agent.env, SSH host keys, a database's access rules, the
 * password hashes. Every such file is covered by /dev/null, every such directory by an empty one,
 * on the real runtime, and stays covered when the host replaces it by a rename (as `passwd`
 * replaces /etc/shadow, and `sed -i` any file it edits). Needs root.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { maskedHostPaths } from '../../agent/src/runtime/sandbox/guest/guest-init.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { refreshEtcView } from '../../agent/src/runtime/sandbox/host/etc-view.js';
import { forgetEtcSecretsScan } from '../../agent/src/runtime/sandbox/guest/etc-secrets.js';
import { destroyLeftDesktops, isRoot, memorySnapshotsHere } from '../helpers/sandbox.js';

describe.skipIf(!isRoot)("the host's /etc in a guest", () => {
  const id = newId('desktop');
  let base: string;
  let driver: SandboxDriver;

  // A secret of the test's own in the host's /etc, there before the agent's scan, and a file any
  // user may read.
  const secret = `/etc/canto-test-secret-${randomBytes(6).toString('hex')}`;
  const conf = `/etc/canto-test-conf-${randomBytes(6).toString('hex')}`;
  // Secrets the host deletes while desktops covering them run or sleep, and one it adds later.
  const [gone, goneAsleep, late] = ['gone', 'gone-asleep', 'late'].map((w) => `/etc/canto-test-${w}-${randomBytes(6).toString('hex')}`) as [string, string, string];

  beforeAll(async () => {
    await writeFile(secret, 'the first secret\n', { mode: 0o600 });
    for (const f of [gone, goneAsleep]) await writeFile(f, 'a secret\n', { mode: 0o600 });
    base = await mkdtemp(join(tmpdir(), 'canto-etc-covers-'));
    driver = await createSandboxDriver({ stateDir: base, goldenTemplates: false, memorySnapshots: await memorySnapshotsHere() });
  });

  afterAll(async () => {
    for (const f of [secret, `${secret}.new`, conf, `${conf}.new`, gone, goneAsleep, late]) await rm(f, { force: true });
    await driver?.close();
    await destroyLeftDesktops(base);
    await rm(base, { recursive: true, force: true });
  });

  it('shows nothing of what only the host root may read there', async () => {
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    const masked = maskedHostPaths();
    expect(masked.files).toContain('/etc/shadow');
    const quote = (path: string) => `'${path.replace(/'/g, `'\\''`)}'`;
    for (const file of masked.files) {
      // A cover refuses to open (a device node under a nodev bind) or reads empty: never a byte.
      const read = await driver.exec(id, { command: `cat ${quote(file)} | wc -c`, timeoutMs: 5_000, maxOutputBytes: 65536 });
      expect(read.stdout.trim(), `${file}: ${read.stderr}`).toBe('0');
    }
    for (const dir of masked.dirs) {
      const listed = await driver.exec(id, { command: `ls -A ${quote(dir)}`, timeoutMs: 5_000, maxOutputBytes: 65536 });
      expect(listed.stdout, dir).toBe('');
    }
    // What others may read stays as the host has it.
    expect((await driver.exec(id, { command: 'grep -c "^root:" /etc/passwd', timeoutMs: 5_000, maxOutputBytes: 100 })).stdout).toBe('1\n');
    await driver.destroy(id);
  }, 60_000);

  it('keeps a secret covered when the host replaces it by a rename', async () => {
    const other = newId('desktop');
    await driver.prepare(other, 'small');
    await driver.start({ desktopId: other, tier: 'small', firstBoot: null });
    const read = async () => (await driver.exec(other, { command: `cat ${secret}`, timeoutMs: 5_000, maxOutputBytes: 1000 })).stdout;
    expect(await read()).toBe('');
    // The host writes the new version beside it and renames it over, as editors and shadow-utils do.
    await writeFile(`${secret}.new`, 'the second secret\n', { mode: 0o600 });
    await rename(`${secret}.new`, secret);
    expect(await read()).toBe('');
    // Restored from its memory snapshot (where this host makes them), it is covered the same way.
    await driver.hibernate(other);
    expect((await driver.start({ desktopId: other, tier: 'small', firstBoot: null })).restored).toBe(await memorySnapshotsHere());
    await writeFile(`${secret}.new`, 'the third secret\n', { mode: 0o600 });
    await rename(`${secret}.new`, secret);
    expect(await read()).toBe('');
    expect((await driver.exec(other, { command: 'grep -c "^root:" /etc/passwd', timeoutMs: 5_000, maxOutputBytes: 100 })).stdout).toBe('1\n');
    await driver.destroy(other);
  }, 60_000);

  it('shows desktops booted after a refresh what the host replaced by a rename in /etc', async () => {
    await writeFile(conf, 'first\n', { mode: 0o644 });
    const [a, b] = [newId('desktop'), newId('desktop')];
    await driver.prepare(a, 'small');
    await driver.start({ desktopId: a, tier: 'small', firstBoot: null });
    const read = async (id: string) => (await driver.exec(id, { command: `cat ${conf}`, timeoutMs: 5_000, maxOutputBytes: 1000 })).stdout;
    expect(await read(a)).toBe('first\n');
    // The host replaces it as `sed -i` would; the view that read it keeps the name it looked up.
    await writeFile(`${conf}.new`, 'second\n', { mode: 0o644 });
    await rename(`${conf}.new`, conf);
    // The next fresh view (every ETC_VIEW_REFRESH_MS) reads it anew for the desktops booted after.
    await refreshEtcView(base);
    await driver.prepare(b, 'small');
    await driver.start({ desktopId: b, tier: 'small', firstBoot: null });
    expect(await read(b)).toBe('second\n');
    // A second refresh unmounts the first view; the desktop booted with it keeps its /etc.
    await refreshEtcView(base);
    expect((await driver.exec(a, { command: 'grep -c "^root:" /etc/passwd', timeoutMs: 5_000, maxOutputBytes: 100 })).stdout).toBe('1\n');
    for (const id of [a, b]) await driver.destroy(id);
  }, 60_000);

  it('keeps the memory of a desktop whose covered secret the host deletes', async (ctx) => {
    if (!(await memorySnapshotsHere())) ctx.skip();
    const other = newId('desktop');
    await driver.prepare(other, 'small');
    await driver.start({ desktopId: other, tier: 'small', firstBoot: null });
    await rm(gone);
    expect(await driver.hibernate(other)).toEqual({ snapshot: true });
    expect(await driver.start({ desktopId: other, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    await driver.destroy(other);
  }, 60_000);

  it('restores after an agent restart that finds secrets gone from /etc and new ones there', async (ctx) => {
    if (!(await memorySnapshotsHere())) ctx.skip();
    const other = newId('desktop');
    await driver.prepare(other, 'small');
    await driver.start({ desktopId: other, tier: 'small', firstBoot: null });
    expect(await driver.hibernate(other)).toEqual({ snapshot: true });
    // While the agent is down, one covered secret goes and a new one comes.
    await driver.close();
    await rm(goneAsleep);
    await writeFile(late, 'a later secret\n', { mode: 0o600 });
    forgetEtcSecretsScan();
    driver = await createSandboxDriver({ stateDir: base, goldenTemplates: false, memorySnapshots: true });
    expect(await driver.start({ desktopId: other, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    const read = async (path: string) => (await driver.exec(other, { command: `cat ${path} 2>/dev/null | wc -c`, timeoutMs: 5_000, maxOutputBytes: 100 })).stdout.trim();
    expect(await read(late)).toBe('0');
    expect(await read(secret)).toBe('0');
    expect((await driver.exec(other, { command: 'grep -c "^root:" /etc/passwd', timeoutMs: 5_000, maxOutputBytes: 100 })).stdout).toBe('1\n');
    await driver.destroy(other);
  }, 60_000);
});
