/**
 * The seccomp filter every guest process runs under: the kernel's key management calls
 * (add_key, request_key, keyctl) answer EPERM. Guests are root without a user namespace, and the
 * kernel keeps keyrings per uid: without it a key one org's desktop adds is read by another's.
 * agent/native/guest-filter.c says more; it holds the same instructions for the spawner's ways
 * into a guest, and a test checks the two agree.
 *
 * Here for bwrap (`--seccomp`, guest-init.ts), for the chain of programs that enters a guest
 * where the spawner is not used (guest-filter.pl), and for the check that a memory snapshot's
 * guest ran under it (host/criu.ts).
 */
import { createHash } from 'node:crypto';
import { guestFile, perlProgram } from './guest-programs.js';

const LD_W_ABS = 0x20;
const ALU_AND_K = 0x54;
const JEQ_K = 0x15;
const JGT_K = 0x25;
const JGE_K = 0x35;
const RET_K = 0x06;
/** Offsets in `struct seccomp_data`. */
const NR = 0;
const ARCH = 4;
const AUDIT_ARCH_X86_64 = 0xc000003e;
const AUDIT_ARCH_I386 = 0x40000003;
const AUDIT_ARCH_AARCH64 = 0xc00000b7;
const AUDIT_ARCH_ARM = 0x40000028;
const X32_SYSCALL_BIT = 0x40000000;
const SECCOMP_RET_ERRNO = 0x00050000;
const SECCOMP_RET_ALLOW = 0x7fff0000;
const EPERM = 1;
const PR_SET_SECCOMP = 22;
const SECCOMP_MODE_FILTER = 2;
const ALLOW = 19;
const DENY = 18;

/** [code, jt, jf, k]; a jump's offsets count from the next instruction. */
const PROGRAM: ReadonlyArray<readonly [number, number, number, number]> = [
  [LD_W_ABS, 0, 0, ARCH],
  [JEQ_K, 0, 6 - 1 - 1, AUDIT_ARCH_X86_64],
  [LD_W_ABS, 0, 0, NR],
  [ALU_AND_K, 0, 0, ~X32_SYSCALL_BIT >>> 0],
  [JGE_K, 0, ALLOW - 4 - 1, 248], // add_key
  [JGT_K, ALLOW - 5 - 1, DENY - 5 - 1, 250], // keyctl
  [JEQ_K, 0, 10 - 6 - 1, AUDIT_ARCH_I386],
  [LD_W_ABS, 0, 0, NR],
  [JGE_K, 0, ALLOW - 8 - 1, 286],
  [JGT_K, ALLOW - 9 - 1, DENY - 9 - 1, 288],
  [JEQ_K, 0, 14 - 10 - 1, AUDIT_ARCH_AARCH64],
  [LD_W_ABS, 0, 0, NR],
  [JGE_K, 0, ALLOW - 12 - 1, 217],
  [JGT_K, ALLOW - 13 - 1, DENY - 13 - 1, 219],
  // 32-bit ARM programs on an arm64 host; a call of any other architecture is refused.
  [JEQ_K, 0, DENY - 14 - 1, AUDIT_ARCH_ARM],
  [LD_W_ABS, 0, 0, NR],
  [JGE_K, 0, ALLOW - 16 - 1, 309],
  [JGT_K, ALLOW - 17 - 1, DENY - 17 - 1, 311],
  [RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM],
  [RET_K, 0, 0, SECCOMP_RET_ALLOW],
];

/** The program as the kernel takes it: an array of `struct sock_filter` (8 bytes each, little-endian). */
export const GUEST_FILTER: Buffer = (() => {
  const out = Buffer.alloc(PROGRAM.length * 8);
  PROGRAM.forEach(([code, jt, jf, k], i) => {
    out.writeUInt16LE(code, i * 8);
    out.writeUInt8(jt, i * 8 + 2);
    out.writeUInt8(jf, i * 8 + 3);
    out.writeUInt32LE(k, i * 8 + 4);
  });
  return out;
})();

/** Names the filter in logs and errors. */
export const GUEST_FILTER_ID = createHash('sha256').update(GUEST_FILTER).digest('hex').slice(0, 12);

/** The descriptor bwrap reads the filter from (cold-boot.ts writes it there). */
export const GUEST_FILTER_FD = 6;

/** The Perl step (agent/guest/guest-filter.pl): installs the filter on itself, then runs the program its arguments name. */
export function guestFilterProgram(): string {
  return perlProgram([guestFile('guest-filter.pl')], {
    GUEST_FILTER_HEX: GUEST_FILTER.toString('hex'), PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
  });
}

/** `perl -e PROGRAM --`, to put in a chain of programs where it still holds every capability (right after nsenter). */
export function guestFilterArgv(): string[] {
  return ['/usr/bin/perl', '-e', guestFilterProgram(), '--'];
}
