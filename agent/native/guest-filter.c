/*
 * The seccomp filter every guest process runs under: the kernel's key management calls
 * (add_key, request_key, keyctl) answer EPERM, as Docker's default profile has them.
 *
 * Why: guests are root without a user namespace, and the kernel keeps a user's keyrings per uid,
 * not per namespace. Every guest and the host's root share uid 0's user and persistent keyrings,
 * so a key one org's desktop adds is read by another's, and by nothing else than a search. No
 * other part of the guest's isolation (namespaces, cgroups, capabilities) reaches them.
 *
 * bwrap installs it for the guest init (`--seccomp`, from guest-filter.ts's copy of these bytes,
 * which `--guest-filter` prints for the agent's check), and every way into a running guest
 * (guest-enter.c) installs it before its program runs; CRIU
 * carries it through a dump and a restore. The program knows x86_64 (and its x32 calls), i386
 * (int 0x80 from a 64-bit process), aarch64 and 32-bit ARM (on an arm64 host that runs such
 * programs); a call of any other architecture is refused whatever it is.
 * guest-filter.ts holds the same instructions, and a test checks the two agree.
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "canto-spawn.h"

#define X32_SYSCALL_BIT 0x40000000u
#define NR offsetof(struct seccomp_data, nr)
#define ARCH offsetof(struct seccomp_data, arch)
#define ALLOW 19
#define DENY 18

/* Each jump's offsets count from the next instruction: the target's index, less the jump's own, less 1. */
static const struct sock_filter GUEST_FILTER[] = {
    /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARCH),
    /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 6 - 1 - 1),
    /* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR),
    /* 3 */ BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~X32_SYSCALL_BIT),
    /* 4 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 248 /* add_key */, 0, ALLOW - 4 - 1),
    /* 5 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 250 /* keyctl */, ALLOW - 5 - 1, DENY - 5 - 1),
    /* 6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 0, 10 - 6 - 1),
    /* 7 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR),
    /* 8 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 286 /* add_key */, 0, ALLOW - 8 - 1),
    /* 9 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 288 /* keyctl */, ALLOW - 9 - 1, DENY - 9 - 1),
    /* 10 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_AARCH64, 0, 14 - 10 - 1),
    /* 11 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR),
    /* 12 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 217 /* add_key */, 0, ALLOW - 12 - 1),
    /* 13 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 219 /* keyctl */, ALLOW - 13 - 1, DENY - 13 - 1),
    /* 14: 32-bit ARM programs on an arm64 host. Any other architecture is refused every call. */
    /* 14 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_ARM, 0, DENY - 14 - 1),
    /* 15 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR),
    /* 16 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 309 /* add_key */, 0, ALLOW - 16 - 1),
    /* 17 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 311 /* keyctl */, ALLOW - 17 - 1, DENY - 17 - 1),
    /* 18 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
    /* 19 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

int install_guest_filter(void) {
  struct sock_fprog prog = {
      .len = (unsigned short)(sizeof GUEST_FILTER / sizeof GUEST_FILTER[0]),
      .filter = (struct sock_filter *)GUEST_FILTER,
  };
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
}

int print_guest_filter(void) {
  const char *bytes = (const char *)GUEST_FILTER;
  size_t left = sizeof GUEST_FILTER;
  while (left > 0) {
    ssize_t n = write(1, bytes, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 1;
    bytes += n;
    left -= (size_t)n;
  }
  return 0;
}
