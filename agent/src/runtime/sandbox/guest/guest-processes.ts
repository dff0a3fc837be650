/**
 * Detached processes (docs/api.md §2.6): started by the guest helper inside the desktop, and tracked only
 * through files in the guest, `/root/.canto/processes/<id>/{script,pid,stdout,stderr,exit_code}`.
 *
 * The runner shell leads its own session and records `<pid> <start time>` in `pid` before it
 * starts; `exit_code` is renamed into place only when the script has ended. A process is `running`
 * while the recorded pid is alive with the recorded start time (a pid reused after a wake or a
 * cold boot has another start time), `exited` once it left an exit code, and `lost` otherwise: it
 * was killed, or the desktop hibernated. Hibernate kills every detached process before the memory
 * snapshot (their sessions are SIGKILLed, runner first, so no exit code is written), because the
 * docs/api.md §3.2 says they do not resume on wake; background jobs of a plain exec are not touched.
 */
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { DetachedSpec, ProcessStatus } from '../../driver.js';
import { GuestCall, type GuestTarget } from './guest-call.js';
import { PROCESS_ID } from '../../../../../shared/src/guest-commands.js';
import { cgroupPids } from '../host/cgroups.js';
import { commandLine } from '../host/host-procs.js';
import { isDetachedRunner } from './guest-helper.js';

const CALL_MS = 30_000;
/** Upper bound of a tail the driver reads, whatever the caller asks (the API caps at 512 KiB). */
const MAX_TAIL_BYTES = 8 * 1024 * 1024;

function malformed(): AgentFailure {
  return new AgentFailure('runtime_error', 'guest helper sent a malformed reply', true);
}

export function assertProcessId(processId: string): void {
  if (typeof processId !== 'string' || !PROCESS_ID.test(processId)) {
    throw new AgentFailure('bad_request', `invalid process id ${JSON.stringify(processId)}`, false);
  }
}

/** Starts `spec.command` detached; a repeated call with the same id does not start it twice. */
export async function spawnGuestProcess(target: GuestTarget, spec: DetachedSpec): Promise<void> {
  assertProcessId(spec.processId);
  // The helper itself keeps only the guest's capabilities: the process it starts runs guest code.
  const call = await GuestCall.start(target, 'spawn', [spec.processId], { timeoutMs: CALL_MS, guestCaps: true });
  void call.send(spec.command).then(() => call.stdin.end());
  await call.status();
}

export async function guestProcessStatus(
  target: GuestTarget,
  processId: string,
  tailBytes: number,
): Promise<ProcessStatus | null> {
  assertProcessId(processId);
  if (!Number.isSafeInteger(tailBytes) || tailBytes < 0) {
    throw new AgentFailure('bad_request', `invalid tail size ${String(tailBytes)}`, false);
  }
  const tail = Math.min(tailBytes, MAX_TAIL_BYTES);
  const call = await GuestCall.start(target, 'status', [processId, String(tail)], { timeoutMs: CALL_MS });
  const fields = await call.status();
  if (fields[0] === 'none') return null;
  const [status, code, outLen, errLen] = fields;
  if (status !== 'running' && status !== 'exited' && status !== 'lost') throw malformed();
  if (outLen === undefined || errLen === undefined || !/^[0-9]+$/.test(outLen) || !/^[0-9]+$/.test(errLen)) {
    throw malformed();
  }
  if (status === 'exited' ? !/^[0-9]{1,3}$/.test(code ?? '') : code !== '-') throw malformed();
  const out = Number(outLen);
  const err = Number(errLen);
  const data = await call.rest(2 * tail);
  if (data.length !== out + err || out > tail || err > tail) throw malformed();
  return {
    status,
    exitCode: status === 'exited' ? Number(code) : null,
    // A tail may start inside a multibyte character; it then decodes to U+FFFD.
    stdoutTail: data.subarray(0, out).toString('utf8'),
    stderrTail: data.subarray(out).toString('utf8'),
  };
}

/** Kills every detached process still running in the guest; returns how many there were. */
export async function killGuestDetached(target: GuestTarget): Promise<number> {
  const call = await GuestCall.start(target, 'kill-detached', [], { timeoutMs: CALL_MS });
  const [n] = await call.status();
  if (n === undefined || !/^[0-9]+$/.test(n)) throw malformed();
  return Number(n);
}

/** Whether any process of the desktop's groups runs a detached process's runner (seen from the host). */
export async function anyDetachedRunner(desktopId: string): Promise<boolean> {
  for (const pid of await cgroupPids(desktopId)) {
    const args = await commandLine(pid);
    if (args !== null && isDetachedRunner(args)) return true;
  }
  return false;
}
