/**
 * The Perl of warm servers (warm-pool.ts), kept in agent/guest/: the host-side prologue that gives
 * a server its listening socket, the pre-forking loop every server runs inside the guest, and the
 * exec server.
 *
 * A server enters the guest as a cold helper does (guest-entry.ts: the cgroups, the namespaces
 * and root, and for exec the guest's bounding set), except that `perl -e PROLOGUE` first binds a
 * Unix socket on the host, in the desktop's driver-only `run/` directory, and hands it down as an
 * open descriptor. Inside the guest the server keeps a few children blocked in
 * accept(2). A child that takes a connection checks that the peer is root and that the connection
 * opens with the server's token (which the agent gave the server on its stdin), answers `+`, then
 * serves exactly one operation with the connection as stdin and stdout, and exits; the server
 * forks a replacement as soon as a child is taken. Nothing is carried from one operation to the
 * next, and an operation costs a connect and a fork inside the guest instead of a fork of the
 * agent, a shell, nsenter and a Perl compile.
 *
 * The server says `ready` on stdout once its first children wait. It exits when its stdin ends
 * (the agent is gone), and its children die with it (PR_SET_PDEATHSIG), so no warm process outlives
 * the agent that started it.
 */
import { guestFile, perlProgram } from './guest-programs.js';

/** Length of the token that opens every connection (hex digits, then a newline). */
export const TOKEN_HEX = 32;

/** What the prefork subs (agent/guest/prefork.pl) need from the agent, besides the shared values. */
export const PREFORK_VALUES = { TOKEN_LEN: TOKEN_HEX + 1 } as const;

/**
 * `perl -e PROLOGUE -- <socket dir> <socket name> <program> <args>...` (agent/guest/warm-prologue.pl),
 * run behind the cgroup join (cgroups.ts): listens on the name inside the directory and execs the
 * program with the socket's descriptor number appended.
 */
export function warmPrologue(): string {
  return perlProgram([guestFile('warm-prologue.pl')]);
}

/**
 * The exec server, inside the guest with the guest's capabilities (agent/guest/exec-server.pl). A
 * child takes `<length as 8 hex digits>\n<command>` and runs it as a cold exec would (`setsid`,
 * then `/bin/sh -c WITH_ENV command`, stdin empty, stdout and stderr real pipes), and relays as
 * frames of a tag byte, 8 hex digits of length and the data: `s` once the command started, `o`/`e`
 * output, `x` the exit code (128 + n for signal n). Like the cold relay it stops at most 5 rounds of
 * 20 ms after the command exits, even while a background job holds the pipes. A `k` from the agent
 * kills the command as a cold kill would and ends the connection without `x`; the agent simply
 * going away leaves the command running, as it does a cold one.
 */
export function execServerProgram(withEnv: string, eintr: number, idle: number): string {
  return perlProgram([guestFile('prefork.pl'), guestFile('exec-server.pl')], {
    ...PREFORK_VALUES,
    WITH_ENV: withEnv,
    EINTR: eintr,
    WARM_IDLE: idle,
  });
}
