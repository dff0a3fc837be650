/**
 * The port forwarder's Perl source (agent/guest/port-forwarder.pl; guest-ports.ts runs it): a
 * pre-forking relay in a desktop's network namespace. Each connection on its unix socket names a
 * guest port in two bytes; a child connects to 127.0.0.1 at that port inside the desktop, answers
 * one status byte (0, or the connect's errno) and relays both directions with backpressure until
 * both have ended.
 */
import { guestFile, perlProgram } from '../guest/guest-programs.js';

/** How long a child waits for the agent's two bytes and for the connect inside the guest. */
const CHILD_CONNECT_SEC = 12;

/** `perl -e FORWARDER -- <desktop id> <listening fd>` (agent/guest/port-forwarder.pl). */
export function forwarderProgram(): string {
  return perlProgram([guestFile('port-forwarder.pl')], { CHILD_CONNECT_SEC });
}
