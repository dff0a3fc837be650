/**
 * How a cold guest call gets into a desktop: the command line that runs a program in the desktop's
 * cgroups (from its first instruction), in every namespace of the guest init and its root, under
 * the guest's seccomp filter (guest-filter.ts), with the guest's bounding set or, for the driver's
 * own calls, every capability.
 *
 * Where the spawner's binary is built, one process does all of it (`canto-spawn --enter`, and
 * `--exec` for commands, which adds the exec relay's real pipes and a session of their own:
 * agent/native/guest-enter.c). Otherwise, or with `CANTO_AGENT_NATIVE_ENTRY=off`, it is the chain
 * of programs the native modes replace: a shell that joins the cgroups (cgroup-join.sh), [the Perl
 * exec relay (exec-relay.ts)], nsenter, the filter's Perl step (guest-filter.pl), [setpriv down to
 * the guest's bounding set], [setsid]. The two are interchangeable; the chain loads six programs
 * and compiles Perl before the program starts, about two thirds of a cold exec's time.
 */
import { execFileSync } from 'node:child_process';
import { cgroupDirs, joinArgv } from '../host/cgroups.js';
import { helperPath } from '../host/spawner.js';
import { execRelay } from './exec-relay.js';
import { GUEST_FILTER, guestFilterArgv } from './guest-filter.js';
import { GUEST_CAPS, GUEST_CAPS_ONLY, nsenterArgv } from './guest-init.js';
import { warmPrologue } from './warm-perl.js';
import { runtimeSwitch } from '../../../env-switch.js';

/** How the native modes' line starts when the guest cannot be entered (its init is gone): the desktop stopped. */
export const ENTER_FAILED = 'canto: cannot enter the guest';

export interface GuestEntry {
  readonly desktopId: string;
  readonly initPid: number;
  /** nsenter, for the chain. */
  readonly nsenterPath: string;
  /** The working directory inside the guest. */
  readonly workdir: string;
  /** Keep only the guest's capabilities (anything that runs guest code); false keeps them all. */
  readonly guestCaps: boolean;
}

/** The spawner's binary, looked for once: every exec asks, and the build does not change under a running agent. */
let built: string | null | undefined;

/** The native modes' binary, unless turned off, not built, or built without this version's seccomp filter. */
function nativeEntry(): string | null {
  if (!runtimeSwitch('CANTO_AGENT_NATIVE_ENTRY')) return null;
  if (built === undefined) built = withGuestFilter(helperPath());
  return built;
}

/**
 * `helper` when it installs the filter guest-filter.ts holds, else null: a binary left from an
 * older build (one that predates the filter answers `--guest-filter` with its usage) would let
 * every cold call into the guest unfiltered, where the chain of programs installs it.
 */
export function withGuestFilter(helper: string | null): string | null {
  if (helper === null) return null;
  try {
    return execFileSync(helper, ['--guest-filter'], { stdio: ['ignore', 'pipe', 'ignore'], timeout: 5_000 }).equals(GUEST_FILTER) ? helper : null;
  } catch {
    return null;
  }
}

/** Whether moving a process into a cgroup is quick on this host (cgroup-migrations.ts); the driver says so at its start. */
let quickMigrations = false;

export function noteQuickMigrations(quick: boolean): void {
  quickMigrations = quick;
}

/**
 * True when a cold exec starts as fast as one handed to a warm exec server (about 4 ms either way
 * here): it enters natively, and its move into the desktop's cgroups does not wait for the kernel
 * (a warm server's child is forked inside them and never moves). Exec then needs no warm server
 * (warm-pool.ts): that saves the server's memory in every desktop that ran a command, and the start
 * that slowed the first exec after each wake from 5 ms to 15-30 ms. Files keep theirs: a cold
 * helper compiles Perl.
 */
export function coldExecIsQuick(): boolean {
  return quickMigrations && nativeEntry() !== null;
}

/** `program` inside the guest, with this process's stdio. */
export function enterArgv(entry: GuestEntry, program: readonly string[]): [string, string[]] {
  const native = nativeEntry();
  if (native !== null) return [native, nativeArgs('--enter', entry, program)];
  return ['/bin/sh', [...joinArgv(entry.desktopId), ...inGuest(entry), ...program]];
}

/**
 * `program` inside the guest in a session of its own, with real pipes for stdio that the exec
 * relay copies to this process's (its stdin is read whole first): a user's command.
 */
export function execArgv(entry: GuestEntry, program: readonly string[]): [string, string[]] {
  const native = nativeEntry();
  if (native !== null) return [native, nativeArgs('--exec', entry, program)];
  return [
    '/bin/sh',
    [
      ...joinArgv(entry.desktopId), '/usr/bin/perl', '-e', execRelay(), '--',
      ...inGuest(entry), '/usr/bin/setsid', ...program,
    ],
  ];
}

/**
 * A warm server (warm-pool.ts): the prologue binds its socket on the host (warm-perl.ts), and then
 * `program` runs inside the guest with that socket's descriptor number appended to its arguments.
 * Natively the prologue starts outside the desktop's cgroups and joins them as it enters: it only
 * binds a socket there, and nothing of the guest runs before the join.
 */
export function warmServerArgv(entry: GuestEntry, socketDir: string, socketName: string, program: readonly string[]): [string, string[]] {
  const prologue = ['-e', warmPrologue(), '--', socketDir, socketName];
  const native = nativeEntry();
  if (native !== null) return ['/usr/bin/perl', [...prologue, native, ...nativeArgs('--enter', entry, program)]];
  return ['/bin/sh', [...joinArgv(entry.desktopId), '/usr/bin/perl', ...prologue, ...inGuest(entry), ...program]];
}

function nativeArgs(mode: '--enter' | '--exec', entry: GuestEntry, program: readonly string[]): string[] {
  const dirs = cgroupDirs(entry.desktopId);
  const keep = entry.guestCaps ? GUEST_CAPS.join(',') : 'all';
  return [mode, String(entry.initPid), entry.workdir, keep, String(dirs.length), ...dirs, '--', ...program];
}

/** The chain's way in: nsenter, the guest's seccomp filter (with every capability still held), then the entry's capabilities. */
function inGuest(entry: GuestEntry): string[] {
  return [...nsenterArgv(entry.nsenterPath, entry.initPid, entry.workdir), ...guestFilterArgv(), ...caps(entry)];
}

function caps(entry: GuestEntry): readonly string[] {
  return entry.guestCaps ? GUEST_CAPS_ONLY : [];
}
