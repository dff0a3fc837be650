/**
 * The sandbox driver refuses to start in an agent holding inheritable or ambient capabilities
 * (host/inherited-caps.ts): for uid 0 the kernel grants those at exec past the bounding set every
 * way into a desktop trims, so each exec, terminal and VNC server in a desktop would get them.
 * Run for real: a process started with `CAP_SYS_ADMIN` inheritable (as `setpriv` or a unit's
 * `CapabilityInheritable=` starts it) creates a driver. Needs root.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/sandbox.js';
import { inheritedCapabilities } from '../../agent/src/runtime/sandbox/host/inherited-caps.js';

const DRIVER = join(import.meta.dirname, '..', '..', 'agent', 'src', 'runtime', 'sandbox', 'index.ts');

describe.skipIf(!isRoot)('an agent with inheritable capabilities', () => {
  let base: string;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-inherited-caps-'));
  });

  afterAll(async () => {
    await rm(base, { recursive: true, force: true });
  });

  /** Creates (and closes) a driver in a process started under `setpriv` with `caps`; its outcome. */
  async function createUnder(caps: string[]): Promise<{ code: number; out: string }> {
    const script = `import(${JSON.stringify(DRIVER)}).then(async (m) => { const d = await m.createSandboxDriver({ stateDir: ${JSON.stringify(join(base, caps.join('-') || 'plain'))}, goldenTemplates: false, memorySnapshots: false }); await d.close(); console.log('started'); }, (e) => { console.log(String(e.message)); process.exit(3); }).catch((e) => { console.log(String(e.message)); process.exit(3); })`;
    try {
      const { stdout } = await promisify(execFile)('setpriv', [...caps, process.execPath, '--import', 'tsx', '-e', script], { timeout: 60_000 });
      return { code: 0, out: stdout };
    } catch (err) {
      const e = err as { code: number; stdout: string };
      return { code: e.code, out: e.stdout };
    }
  }

  it('is refused, saying how to start the agent instead', async () => {
    for (const caps of [['--inh-caps=+sys_admin'], ['--inh-caps=+sys_admin', '--ambient-caps=+sys_admin']]) {
      const run = await createUnder(caps);
      expect(run.code, run.out).toBe(3);
      expect(run.out).toMatch(/runs with inheritable \(0x200000\) or ambient \(0x(0|200000)\) capabilities.*CapabilityInheritable=/);
    }
    const plain = await createUnder([]);
    expect(plain, plain.out).toMatchObject({ code: 0, out: expect.stringContaining('started') });
    // One a guest has anyway (in its own set) is harmless, as a unit's ambient CAP_NET_BIND_SERVICE.
    const harmless = await createUnder(['--inh-caps=+net_bind_service', '--ambient-caps=+net_bind_service']);
    expect(harmless, harmless.out).toMatchObject({ code: 0, out: expect.stringContaining('started') });
  }, 120_000);

  it('reads the masks /proc/<pid>/status shows', () => {
    expect(inheritedCapabilities('CapInh:\t0000000000200000\nCapPrm:\t000001ffffffffff\nCapAmb:\t0000000000000004\n')).toEqual({ inheritable: 0x200000n, ambient: 4n });
    expect(inheritedCapabilities('CapInh:\t0000000000000000\nCapAmb:\t0000000000000000\n')).toEqual({ inheritable: 0n, ambient: 0n });
  });
});
