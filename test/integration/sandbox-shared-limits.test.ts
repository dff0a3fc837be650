/**
 * What root in every guest shares with the host's root (host/shared-limits.ts): the sandbox
 * driver raises the per-user inotify limits at its start, so a desktop opening inotify instances
 * past the kernel's default of 128 does not leave the host and every other desktop without one,
 * and the per-user pipe buffer limit, so one desktop's large pipes do not shrink every other's.
 * Needs root.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { SHARED_LIMITS } from '../../agent/src/runtime/sandbox/host/shared-limits.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';

/** Perl that opens `n` inotify instances (x86_64 inotify_init1), holds them, and prints how many it got. */
const holdInotify = (n: number) => `my @f; for (1..${n}) { my $fd = syscall(294, 0); last if $fd < 0; push @f, $fd } print scalar(@f), "\\n"; sleep 2;`;

/** Perl that grows `n` pipes to 1 MiB each (F_SETPIPE_SZ), holds them, and prints how many it grew. */
const growPipes = (n: number) =>
  `my @p; my $n = 0; for (1..${n}) { pipe(my $r, my $w) or last; fcntl($w, 1031, 1 << 20) or last; push @p, $r, $w; $n++ } print "$n\\n"; sleep 3;`;
/** Perl that prints the size of a new pipe (F_GETPIPE_SZ). */
const newPipeSize = 'pipe(my $r, my $w) or die; print fcntl($w, 1032, 0), "\\n";';

describe.skipIf(!isRoot || process.arch !== 'x64')('limits every guest shares with the host', () => {
  const id = newId('desktop');
  let base: string;
  let driver: SandboxDriver;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-shared-limits-'));
    driver = await createSandboxDriver({ stateDir: base, goldenTemplates: false, memorySnapshots: false });
  });

  afterAll(async () => {
    await driver?.close();
    await destroyLeftDesktops(base);
    await rm(base, { recursive: true, force: true });
  });

  it('are raised, so one desktop holding hundreds of inotify instances leaves the host its own', async () => {
    for (const [name, floor] of Object.entries(SHARED_LIMITS)) {
      expect(Number(readFileSync(join('/proc/sys', name), 'utf8')), name).toBeGreaterThanOrEqual(floor);
    }
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    const holding = driver.exec(id, { command: `perl -e '${holdInotify(300)}'`, timeoutMs: 20_000, maxOutputBytes: 100 });
    await new Promise((r) => setTimeout(r, 1_000));
    // Meanwhile the host's root opens one, as systemd or the agent would.
    expect(execFileSync('perl', ['-e', holdInotify(1).replace('sleep 2;', '')], { encoding: 'utf8' })).toBe('1\n');
    expect((await holding).stdout).toBe('300\n');
    await driver.destroy(id);
  }, 60_000);

  it('leave one desktop\'s pipes no say over another\'s', async () => {
    const [a, b] = [newId('desktop'), newId('desktop')];
    for (const d of [a, b]) {
      await driver.prepare(d, 'small');
      await driver.start({ desktopId: d, tier: 'small', firstBoot: null });
    }
    // Desktop A grows 80 pipes to 1 MiB each (past the per-user 64 MiB the kernel allows by
    // default) and holds them.
    const holding = driver.exec(a, { command: `perl -e '${growPipes(80)}'`, timeoutMs: 20_000, maxOutputBytes: 100 });
    await new Promise((r) => setTimeout(r, 1_000));
    // Desktop B gets a pipe of the usual size.
    expect((await driver.exec(b, { command: `perl -e '${newPipeSize}'`, timeoutMs: 10_000, maxOutputBytes: 100 })).stdout).toBe('65536\n');
    expect((await holding).stdout).toBe('80\n');
    for (const d of [a, b]) await driver.destroy(d);
  }, 60_000);
});
