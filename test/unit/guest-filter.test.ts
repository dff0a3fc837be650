/**
 * The guest's seccomp filter (agent/src/runtime/sandbox/guest/guest-filter.ts) run by a small
 * classic-BPF interpreter over `struct seccomp_data`, for every architecture a guest's calls can
 * come in: the key management calls are refused and their neighbours allowed, and a call of an
 * architecture it does not know is refused. The kernel runs the same bytes in
 * test/integration/sandbox-keyrings.test.ts, and the spawner's copy is compared there.
 */
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { GUEST_FILTER } from '../../agent/src/runtime/sandbox/guest/guest-filter.js';
import { withGuestFilter } from '../../agent/src/runtime/sandbox/guest/guest-entry.js';

const ALLOW = 0x7fff0000;
const EPERM = 0x00050001;

/** Runs the filter on a call: what it returns. Knows the instructions the filter uses, nothing else. */
function run(arch: number, nr: number): number {
  let a = 0;
  for (let pc = 0; pc < GUEST_FILTER.length / 8; ) {
    const code = GUEST_FILTER.readUInt16LE(pc * 8);
    const jt = GUEST_FILTER.readUInt8(pc * 8 + 2);
    const jf = GUEST_FILTER.readUInt8(pc * 8 + 3);
    const k = GUEST_FILTER.readUInt32LE(pc * 8 + 4);
    pc++;
    if (code === 0x20) a = k === 0 ? nr >>> 0 : k === 4 ? arch >>> 0 : Number.NaN;
    else if (code === 0x54) a = (a & k) >>> 0;
    else if (code === 0x15) pc += a === k ? jt : jf;
    else if (code === 0x25) pc += a > k ? jt : jf;
    else if (code === 0x35) pc += a >= k ? jt : jf;
    else if (code === 0x06) return k;
    else throw new Error(`instruction ${code.toString(16)} is not one the filter should use`);
  }
  throw new Error('the filter ran off its end');
}

const ARCHES = { x86_64: 0xc000003e, i386: 0x40000003, aarch64: 0xc00000b7, arm: 0x40000028 };
/** add_key, request_key and keyctl, which are consecutive on each. */
const KEY_CALLS: Record<keyof typeof ARCHES, number> = { x86_64: 248, i386: 286, aarch64: 217, arm: 309 };

describe('the guest seccomp filter', () => {
  it('refuses the key management calls of every architecture a guest runs, and nothing next to them', () => {
    for (const [name, arch] of Object.entries(ARCHES) as Array<[keyof typeof ARCHES, number]>) {
      const first = KEY_CALLS[name];
      for (const nr of [first, first + 1, first + 2]) expect(run(arch, nr), `${name} ${nr}`).toBe(EPERM);
      for (const nr of [0, 1, first - 1, first + 3, 435]) expect(run(arch, nr), `${name} ${nr}`).toBe(ALLOW);
    }
  });

  it("refuses x32's calls too, which are x86_64's with bit 30 set", () => {
    for (const nr of [248, 249, 250]) expect(run(ARCHES.x86_64, 0x40000000 | nr)).toBe(EPERM);
    expect(run(ARCHES.x86_64, 0x40000000 | 0)).toBe(ALLOW);
  });

  it('refuses every call of an architecture it does not know', () => {
    const riscv64 = 0xc00000f3;
    for (const nr of [0, 63, 217, 248]) expect(run(riscv64, nr)).toBe(EPERM);
  });

  describe('the spawner binary', () => {
    const dir = mkdtempSync(join(tmpdir(), 'canto-filter-'));
    afterAll(() => rmSync(dir, { recursive: true, force: true }));
    const script = (name: string, body: string) => {
      const path = join(dir, name);
      writeFileSync(path, `#!/bin/sh\n${body}\n`);
      chmodSync(path, 0o755);
      return path;
    };

    it('is used for entry only when it installs this filter', () => {
      const same = join(dir, 'filter.bin');
      writeFileSync(same, GUEST_FILTER);
      expect(withGuestFilter(script('current', `cat '${same}'`))).not.toBeNull();
      // A build from before the filter answers its usage and fails; another filter is another build.
      expect(withGuestFilter(script('older', 'echo "usage: canto-spawn SOCKET-PATH" >&2; exit 2'))).toBeNull();
      expect(withGuestFilter(script('other', `head -c 8 '${same}'`))).toBeNull();
      expect(withGuestFilter(null)).toBeNull();
    });
  });
});
