/**
 * The guest helper: a short Perl program that does every file and detached-process operation
 * (and talks to the X server: the screen size, pointer and key input) from inside a desktop. The driver runs it through nsenter with the guest init's mount namespace
 * and root (see guest-call.ts), so every path it touches is resolved by the kernel against the
 * guest's own tree: an absolute symlink, `..` at the root or `/proc/1/root` all stay inside the
 * guest. No guest path is ever opened from the host side.
 *
 * Perl because it is in every Debian image (the guest's `/usr` is the host's, read-only) and can
 * make the few raw system calls needed (statx for millisecond mtimes, linkat for anonymous temp
 * files, setsid) without loading a module: startup time is paid on every operation, and a module
 * costs milliseconds (Time::HiRes alone ≈6 ms, POSIX ≈9 ms). Each operation gets only its own
 * code (agent/guest/helper/), which halves the compile time.
 *
 *   perl -e PROGRAM(op) -- <op> <args>...
 *
 * A warm helper is a child of the desktop's file server (warm-pool.ts, warm-perl.ts): the program
 * of every operation but `spawn` compiled in, it reads the operation and its arguments as the first
 * input of its connection (helperRequest) and from there on is the same program speaking the same
 * protocol. `spawn` starts guest code and needs the guest's capabilities, so it always runs cold.
 *
 * Protocol. stdout starts with one status line, then raw data for the ops that return some:
 *   OK <fields...>\n                          success
 *   ERR <code> <current size or -> <text>\n   failure; code is an AgentFailure code
 * Ops and their OK fields:
 *   stat <path>                    OK <type> <size> <mtime ms> <octal mode>
 *   list <path> <limit>            OK <truncated 0|1>, then per entry `<type> <size> <mtime ms> <name>\0`
 *   read <path> <offset|-> <length> <max whole> [<handoff from>]
 *                                  OK <size> <length>, then exactly <length> bytes; or, when
 *                                  <length> is at least <handoff from>, OK <size> <length> <pid>
 *                                  <fd> <dev> <ino> and the agent reads the descriptor itself
 *                                  (guest-handoff.ts) until it ends stdin
 *   write <path> <append at|-> <max append> [h]
 *                                  stdin: chunks `<decimal length>\n<bytes>`, then `0\n` to commit;
 *                                  EOF before `0\n` aborts and changes nothing. Answers OK. With
 *                                  `h` (replacing only), first OK <pid> <fd> <dev> <ino> of the
 *                                  temporary, which the agent fills; stdin is then `0\n` alone
 *   delete <path> <recursive 0|1>  OK
 *   spawn <id>                     stdin: the script. OK (also when <id> was already started)
 *   status <id> <tail bytes>       OK none | OK <running|exited|lost> <code|-> <out len> <err len>,
 *                                  then both tails
 *   kill-detached                  OK <number of process sessions killed>
 *   xsize                          OK <width> <height> of the X screen now; the X server not
 *                                  answering is ERR runtime_error (the X session is down)
 *   xinput <step>...               OK <x> <y> of the cursor once the steps are played, or OK
 *                                  script when a key is not one to press as xdotool would
 *                                  (helper/op-xinput.pl lists the steps)
 * A helper that dies without a status line (killed, desktop stopped) is reported by the caller.
 */
import { guestFile, perlProgram, type PerlValue } from './guest-programs.js';
import { PREFORK_VALUES } from './warm-perl.js';
import { warmServerArgv } from './guest-entry.js';
import { spawnProcess, type SpawnedProcess } from '../host/spawner.js';
import { GUEST_CAP_MASK, GUEST_PATH } from './guest-init.js';
import { PROCESS_ID_SOURCE } from '../../../../../shared/src/guest-commands.js';

/** Children a warm server (file or exec) keeps waiting, so that a run of operations never waits for a fork. */
export const WARM_IDLE = 2;

/** Largest append chunk the helper buffers (the API's limit is 8 MiB). */
export const MAX_APPEND_BYTES = 8 * 1024 * 1024;

/** Where detached processes keep their files inside the guest. */
export const PROCESSES_DIR = '/root/.canto/processes';

export type HelperOp = 'stat' | 'list' | 'read' | 'write' | 'delete' | 'spawn' | 'status' | 'kill-detached' | 'xsize' | 'xinput';

/** The guest's X server (display :0, guest-init.ts) listens here. */
const X_SOCKET = '/tmp/.X11-unix/X0';
/** `xsize` and `xinput` give up on an X server that accepts but does not answer (stopped, or an impostor). */
export const X_ANSWER_SEC = 2;
/**
 * How long `xinput` waits for the cursor to reach where its steps put it, in the clock's whole
 * seconds (so between one less and this). The window manager's synchronous button grab makes
 * the X server hold pointer events after a press until the window manager lets them through, and
 * the server reports the cursor only as far as it has processed them; on a loaded host that
 * takes a while. Past this, the call answers where the server says.
 */
export const X_SETTLE_SEC = 3;

/**
 * The runner of a detached process, started as `/bin/sh -c RUNNER <dir>`: the env file applied,
 * output to files, and the exit code renamed into place only once the script has ended. `$0` is
 * the directory because a positional parameter cannot be overridden by the env file.
 */
const RUNNER =
  'cd /root; [ -f /root/.canto/env ] && . /root/.canto/env; ' +
  '/bin/sh "$0/script" >"$0/stdout" 2>"$0/stderr" </dev/null; ' +
  'echo $? >"$0/.exit_code.tmp" && mv -f "$0/.exit_code.tmp" "$0/exit_code"';

/**
 * Whether a process's command line (from /proc, split at NULs) is a detached process's runner.
 * A guest program can pretend to be one; the host only uses this to skip work when none runs.
 */
export function isDetachedRunner(args: readonly string[]): boolean {
  return args.length === 4 && args[0] === '/bin/sh' && args[1] === '-c' && args[2] === RUNNER;
}

/**
 * Each operation's sections (agent/guest/helper/*.pl), in order: shared routines, then its body. A
 * cold helper gets only its own, because Perl compiles the whole program on every start and
 * compile time grows with its length; a warm helper compiles everything once, before it is needed.
 */
const OPS: Readonly<Record<HelperOp, readonly string[]>> = {
  stat: ['xstat'],
  list: ['xstat'],
  read: [],
  write: ['files'],
  delete: [],
  spawn: ['procs'],
  status: ['procs'],
  'kill-detached': ['procs'],
  xsize: ['xconn'],
  xinput: ['xconn'],
};

/** The helper's values (the shared ones, system calls, errno and open flags, come on their own). */
function values(): Record<string, PerlValue> {
  return {
    ...PREFORK_VALUES,
    PROCESSES_DIR,
    PROCESS_ID: PROCESS_ID_SOURCE,
    RUNNER,
    WARM_IDLE,
    X_SOCKET,
    X_ANSWER_SEC,
    X_SETTLE_SEC,
    GUEST_CAP_MASK,
  };
}

const section = (name: string): string => guestFile(`helper/${name}.pl`);

function build(op: HelperOp | 'warm'): string {
  const start = [section('start')];
  if (op === 'warm') {
    const ops = (Object.keys(OPS) as HelperOp[]).filter((name) => name !== 'spawn');
    const sections = [...new Set(ops.flatMap((name) => OPS[name]))];
    // Every section, then each body in a block of its own, chosen by the request.
    const branches = ops.map((name, i) => `${i === 0 ? 'if' : 'elsif'} ($op eq '${name}') {\n${section(`op-${name}`)}}\n`);
    const unknown = `else { fail('bad_request', 'unknown helper operation'); }\n`;
    return perlProgram(
      [...start, guestFile('prefork.pl'), section('warm-request'), section('prelude'), ...sections.map(section), ...branches, unknown, 'exit 0;\n'],
      values(),
    );
  }
  const needs = OPS[op];
  if (needs === undefined) throw new Error(`unknown helper operation ${op}`);
  return perlProgram([...start, section('prelude'), ...needs.map(section), section(`op-${op}`), 'exit 0;\n'], values());
}

const programs = new Map<HelperOp | 'warm', string>();

function program(op: HelperOp | 'warm'): string {
  let text = programs.get(op);
  if (text === undefined) programs.set(op, (text = build(op)));
  return text;
}

/** The helper's source for one operation, built once per operation. */
export function guestHelperProgram(op: HelperOp): string {
  return program(op);
}

/** The source of the warm file server: every operation but `spawn`, chosen by the request. */
export function warmHelperProgram(): string {
  return program('warm');
}

/**
 * The request that tells a warm helper what to do: `<length as 8 hex digits>\n`, then the operation
 * and its arguments separated by NULs. A NUL cannot occur in an argument (guest paths are
 * checked for it, the rest are numbers and ids), so the fields are unambiguous whatever else
 * (newlines, spaces) a path holds.
 */
export function helperRequest(op: HelperOp, args: readonly string[]): Buffer {
  const fields = [op, ...args];
  if (fields.some((f) => f.includes('\0'))) throw new Error('a helper argument holds a NUL');
  return lengthFramed(Buffer.from(fields.join('\0'), 'utf8'));
}

/** `<length as 8 hex digits>\n<body>`: how a warm child (file or exec) reads its request. */
export function lengthFramed(body: Buffer): Buffer {
  return Buffer.concat([Buffer.from(`${body.length.toString(16).padStart(8, '0')}\n`, 'latin1'), body]);
}

/**
 * Starts the warm file server: into the guest as a cold helper goes (guest-entry.ts), with the
 * socket bound on the host first, and every operation but `spawn` compiled in. A group of its own (detached), so retiring
 * it kills everything it forked.
 */
export function startWarmFileServer(desktopId: string, initPid: number, nsenterPath: string, socketDir: string, socketName: string): Promise<SpawnedProcess> {
  const entry = { desktopId, initPid, nsenterPath, workdir: '/', guestCaps: false };
  const [file, args] = warmServerArgv(entry, socketDir, socketName, ['/usr/bin/perl', '-e', warmHelperProgram(), '--']);
  return spawnProcess(
    file,
    args,
    { env: { PATH: GUEST_PATH }, stdio: ['pipe', 'pipe', 'pipe'], detached: true },
  );
}
