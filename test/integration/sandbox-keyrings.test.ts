/**
 * Guests share no keyring (guest/guest-filter.ts): they are root without a user namespace, and
 * the kernel keeps keyrings per uid, so without the seccomp filter a key one desktop adds is read
 * by every other desktop and by the host's root. Every way into a guest runs under the filter:
 * the guest init and what it starts (bwrap), a cold exec and a file helper (the spawner's native
 * entry), the chain of programs without it (nsenter, then guest-filter.pl), and a restored guest
 * (CRIU keeps the filter). A memory snapshot whose init ran without it, or whose images lack its
 * bytes, boots cold. Needs root.
 */
import { execFileSync } from 'node:child_process';
import { readFile, rm, mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { GUEST_FILTER, GUEST_FILTER_ID, guestFilterArgv } from '../../agent/src/runtime/sandbox/guest/guest-filter.js';
import { detectCriu } from '../../agent/src/runtime/sandbox/host/criu.js';
import { helperPath } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';

const criu = isRoot && process.arch === 'x64' ? await detectCriu(undefined) : null;

/** Perl that adds (`add`) or looks for (`find`) a key in root's user keyring: what it got, or the errno. */
function keyProbe(what: 'add' | 'find', name: string): string {
  const call = what === 'add' ? 'syscall(248, $t, $d, $p, length($p), -4)' : 'syscall(250, 10, -4, $t, $d, 0)';
  return `my ($t, $d, $p) = ("user", "${name}", "secret"); my $r = ${call}; print $r < 0 ? "errno " . ($! + 0) . "\\n" : "key\\n";`;
}
const EPERM = 'errno 1\n';
const ENOKEY = 'errno 126\n';

/** The probe on the host, as root: what a guest without the filter would see. */
function onHost(what: 'add' | 'find', name: string, through: string[] = []): string {
  return execFileSync(through[0] ?? 'perl', [...through.slice(1), ...(through.length > 0 ? ['perl'] : []), '-e', keyProbe(what, name)], { encoding: 'utf8' });
}

describe.skipIf(criu === null)('keyrings in guests', () => {
  let base: string;
  let driver: SandboxDriver;
  const name = `canto-test-${newId('desktop')}`;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-keyrings-'));
    driver = await createSandboxDriver({ stateDir: join(base, 'state'), goldenTemplates: false });
  });

  afterAll(async () => {
    // A guest that got through (the filter broken) left its key in root's keyring: unlinked.
    if (onHost('find', name) !== ENOKEY) execFileSync('perl', ['-e', `my ($t, $d) = ("user", "${name}"); syscall(250, 9, syscall(250, 10, -4, $t, $d, 0), -4);`]);
    await driver?.close();
    await destroyLeftDesktops(join(base, 'state'));
    await rm(base, { recursive: true, force: true });
  });

  const probe = async (id: string, what: 'add' | 'find') =>
    (await driver.exec(id, { command: `perl -e '${keyProbe(what, name)}'`, timeoutMs: 10_000, maxOutputBytes: 1000 })).stdout;

  it('the spawner and this module hold the same filter', () => {
    const helper = helperPath();
    expect(helper, 'the spawner is built (npm run build)').not.toBeNull();
    expect(execFileSync(helper!, ['--guest-filter'])).toEqual(GUEST_FILTER);
  });

  it('the chain of programs installs it before the program it names', () => {
    expect(onHost('find', name, guestFilterArgv())).toBe(EPERM);
    // Without it, root on the host reaches the keyring every guest would share.
    expect(onHost('find', name)).toBe(ENOKEY);
  });

  it('keeps every guest, cold or restored, out of the keyrings', async () => {
    const a = newId('desktop');
    const b = newId('desktop');
    for (const id of [a, b]) {
      await driver.prepare(id, 'small');
      await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    }
    const initStatus = async (id: string) => (await driver.exec(id, { command: 'grep ^Seccomp: /proc/1/status', timeoutMs: 5_000, maxOutputBytes: 100 })).stdout;
    expect(await initStatus(a)).toBe('Seccomp:\t2\n');
    expect(await probe(a, 'add')).toBe(EPERM);
    expect(await probe(b, 'find')).toBe(EPERM);
    // The chain of programs, where the spawner's entry is off.
    process.env.CANTO_AGENT_NATIVE_ENTRY = 'off';
    try {
      expect(await probe(b, 'add')).toBe(EPERM);
    } finally {
      delete process.env.CANTO_AGENT_NATIVE_ENTRY;
    }
    // Nothing reached root's keyring either.
    expect(onHost('find', name)).toBe(ENOKEY);

    expect(await driver.hibernate(a)).toEqual({ snapshot: true });
    expect((await driver.start({ desktopId: a, tier: 'small', firstBoot: null })).restored).toBe(true);
    expect(await initStatus(a)).toBe('Seccomp:\t2\n');
    expect(await probe(a, 'add')).toBe(EPERM);

    // An image whose init ran without a filter (a guest booted before it existed, whose entrants
    // since carry it) is not restored: it boots cold, filtered.
    const snapshot = join(base, 'state', 'desktops', a, 'snapshot');
    expect(await driver.hibernate(a)).toEqual({ snapshot: true });
    expect(await readFile(join(snapshot, 'init-filtered'), 'utf8')).toBe(`${GUEST_FILTER_ID}\n`);
    await rm(join(snapshot, 'init-filtered'));
    expect((await driver.start({ desktopId: a, tier: 'small', firstBoot: null })).restored).toBe(false);
    expect(await initStatus(a)).toBe('Seccomp:\t2\n');

    // Nor is one whose guest ran under another filter (or none).
    expect(await driver.hibernate(a)).toEqual({ snapshot: true });
    const images = join(snapshot, 'seccomp.img');
    const bytes = await readFile(images);
    // Every copy (a warm server entered on its own holds one beside the init's).
    let copies = 0;
    for (let at = bytes.indexOf(GUEST_FILTER); at >= 0; at = bytes.indexOf(GUEST_FILTER, at + 1), copies++) {
      // The errno the filter answers (the k of its next-to-last instruction): EPERM becomes ENOENT.
      const errno = at + GUEST_FILTER.length - 2 * 8 + 4;
      bytes.writeUInt8(bytes.readUInt8(errno) ^ 0x02, errno);
    }
    expect(copies).toBeGreaterThan(0);
    await writeFile(images, bytes);
    expect((await driver.start({ desktopId: a, tier: 'small', firstBoot: null })).restored).toBe(false);
    expect(await initStatus(a)).toBe('Seccomp:\t2\n');
    expect(await probe(a, 'add')).toBe(EPERM);
    for (const id of [a, b]) await driver.destroy(id);
  }, 120_000);
});
