/**
 * The test dump before memory snapshots are offered (agent/src/runtime/sandbox/host/criu.ts
 * `dumpProbe`), with the real CRIU behind wrappers: a probe that fails once, for a passing cause,
 * is tried again and snapshots stay on (one failure used to turn them off until the next boot,
 * the answer kept in /run); a probe that fails every time turns them off, and says why.
 */
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { detectCriu, DUMP_PROBE_CACHE } from '../../agent/src/runtime/sandbox/host/criu.js';
import { isRoot } from '../helpers/sandbox.js';

const criu = isRoot ? await detectCriu(undefined) : null;

describe.skipIf(criu === null)('the dump probe', () => {
  let base: string;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-criu-probe-test-'));
  });

  afterAll(async () => {
    if (base) await rm(base, { recursive: true, force: true });
  });

  /** A CRIU that fails the probe's dump (`--leave-running`) the first `times` times. */
  async function failingProbe(name: string, times: number): Promise<string> {
    const wrapper = join(base, name);
    const count = join(base, `${name}.count`);
    await writeFile(count, '0');
    await writeFile(wrapper, [
      '#!/bin/sh',
      'case " $* " in *" dump "*"--leave-running"*)',
      `  n=$(cat ${count}); echo $((n + 1)) > ${count}`,
      `  if [ "$n" -lt ${times} ]; then echo "Error (test): the probe failed" >&2; exit 1; fi;;`,
      'esac',
      `exec ${criu!.path} "$@"`,
      '',
    ].join('\n'));
    await chmod(wrapper, 0o755);
    return wrapper;
  }

  it('tries a failed probe once more, and offers snapshots when that one works', async () => {
    const wrapper = await failingProbe('criu-failing-once', 1);
    const logged: string[] = [];
    expect(await detectCriu(wrapper, (msg) => void logged.push(msg))).toMatchObject({ path: wrapper });
    expect(logged.filter((m) => m.startsWith('memory snapshots are off'))).toEqual([]);
    expect(Number(await readFile(join(base, 'criu-failing-once.count'), 'utf8'))).toBe(2);
    expect(JSON.parse(await readFile(DUMP_PROBE_CACHE, 'utf8'))).toMatchObject({ problem: null });
  });

  it('turns snapshots off, saying why, when the probe fails again', async () => {
    const wrapper = await failingProbe('criu-failing', 1000);
    const logged: Array<{ msg: string; fields?: object }> = [];
    expect(await detectCriu(wrapper, (msg, fields) => void logged.push({ msg, fields }))).toBeNull();
    expect(logged).toEqual([{ msg: 'memory snapshots are off: CRIU cannot dump on this host', fields: expect.objectContaining({ problem: expect.stringContaining('a test dump failed') }) }]);
    expect(Number(await readFile(join(base, 'criu-failing.count'), 'utf8'))).toBe(2);
  });
});
