/**
 * Runs a module in a Node process of its own with the process spawner turned off
 * (`CANTO_AGENT_SPAWN_HELPER=off`, read once per process), for the tests of the fallback to Node's
 * spawn. The module imports `SPAWNER` (the spawner's source) and prints one JSON line, which is
 * returned parsed.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';

/** The spawner's source, for the module's imports. */
export const SPAWNER = JSON.stringify(join(process.cwd(), 'agent/src/runtime/sandbox/host/spawner.ts'));

export async function runWithoutSpawner<T>(dir: string, name: string, module: string): Promise<T> {
  const file = join(dir, `${name}.mts`);
  await writeFile(file, module);
  const child = spawn(process.execPath, ['--import', 'tsx', file], { env: { ...process.env, CANTO_AGENT_SPAWN_HELPER: 'off' } });
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  await once(child, 'close');
  return JSON.parse(out) as T;
}
