/**
 * The fake driver's "shell": the handful of commands tests of the layers above run through exec
 * and detached processes (`true`, `false`, `exit N`, `echo …`, `sleep S`), answered without any
 * process. Anything else is "not found" (127), as a shell would say; a `sleep` longer than the
 * command's deadline waits out the deadline and times out, as a real guest command would.
 */
import { AgentFailure } from '../../../shared/src/protocol.js';

export interface FakeCommandResult {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** `pause` waits as the driver does (it fails once the driver closes). */
export async function runFakeCommand(command: string, timeoutMs: number, pause: (ms: number) => Promise<void>): Promise<FakeCommandResult> {
  const [name = '', ...args] = command.trim().split(/\s+/);
  switch (name) {
    case 'true':
      return { exitCode: 0, stdout: '', stderr: '' };
    case 'false':
      return { exitCode: 1, stdout: '', stderr: '' };
    case 'exit':
      return { exitCode: Number.parseInt(args[0] ?? '0', 10) || 0, stdout: '', stderr: '' };
    case 'echo':
      return { exitCode: 0, stdout: `${args.join(' ')}\n`, stderr: '' };
    case 'sleep': {
      const ms = Number(args[0] ?? '0') * 1000;
      if (ms > timeoutMs) {
        await pause(timeoutMs);
        throw new AgentFailure('timeout', `command timed out after ${timeoutMs} ms`, false);
      }
      await pause(ms);
      return { exitCode: 0, stdout: '', stderr: '' };
    }
    default:
      return { exitCode: 127, stdout: '', stderr: `sh: ${name}: not found\n` };
  }
}
