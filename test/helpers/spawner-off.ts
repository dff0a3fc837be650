/**
 * Runs a module in a Node process of its own: with the process spawner turned off
 * (`CANTO_AGENT_SPAWN_HELPER=off`, read once per process), for the tests of the fallback to Node's
 * spawn, or with a descriptor it inherited, for the tests that none reaches its children. The module imports `SPAWNER` (the spawner's source) and prints one JSON line, which is
 * returned parsed.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { strayStdio } from './processes.js';

/** The spawner's source, for the module's imports. */
export const SPAWNER = JSON.stringify(join(process.cwd(), 'agent/src/runtime/sandbox/host/spawner.ts'));

export async function runWithoutSpawner<T>(dir: string, name: string, module: string): Promise<T> {
  return runModule(dir, name, module, { CANTO_AGENT_SPAWN_HELPER: 'off' }, []);
}

/**
 * Runs the module the same way, the spawner on, with `stray` open in its process as
 * STRAY_CHILD_FD and not close-on-exec: what a supervisor or shell that leaks a descriptor hands
 * the agent.
 */
export async function runWithStray<T>(dir: string, name: string, module: string, stray: number): Promise<T> {
  return runModule(dir, name, module, {}, strayStdio(stray));
}

async function runModule<T>(dir: string, name: string, module: string, env: Record<string, string>, extra: Array<'ignore' | number>): Promise<T> {
  const file = join(dir, `${name}.mts`);
  await writeFile(file, module);
  const child = spawn(process.execPath, ['--import', 'tsx', file], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit', ...extra] });
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  await once(child, 'close');
  return JSON.parse(out) as T;
}
