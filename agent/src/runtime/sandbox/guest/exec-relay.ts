/**
 * The exec relay: a short Perl program (agent/guest/exec-relay.pl) between the agent and nsenter.
 *
 * Node gives a child's stdio as Unix socketpairs. A background job started by an exec inherits
 * them, and CRIU cannot dump a process holding a socket whose peer is outside the dumped tree. The
 * relay therefore gives the guest command real pipes and copies them to the agent. It runs behind
 * the cgroup join (cgroups.ts), so the command is limited from its first instruction, and exits
 * shortly after the command does even if a background job keeps the pipes open: that job then sees
 * a closed pipe, as after a closed terminal, and the exec does not hang.
 *
 *   sh -c JOIN canto-join <n> <cgroup dir>... perl -e RELAY -- <program> <args>...
 *
 * Where the spawner binary is built, its `--exec` mode is the relay instead (guest-entry.ts).
 */
import { JOIN_FAILED } from '../host/cgroups.js';
import { guestFile, perlProgram } from './guest-programs.js';

/** What the relay's chain prints when the desktop's cgroups cannot be joined (exit 97). */
export const RELAY_JOIN_FAILED = JOIN_FAILED;

export function execRelay(): string {
  return perlProgram([guestFile('exec-relay.pl')]);
}
