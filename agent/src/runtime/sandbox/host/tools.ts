/** The host tools the sandbox driver runs, found once at start-up. */
import { access, constants } from 'node:fs/promises';
import { delimiter, join } from 'node:path';

/** Finds a system tool on PATH, else at its usual location. */
export async function resolveTool(name: string, fallback: string): Promise<string> {
  const dirs = (process.env.PATH ?? '').split(delimiter).filter((d) => d.startsWith('/'));
  for (const candidate of [...dirs.map((d) => join(d, name)), fallback]) {
    try {
      await access(candidate, constants.X_OK);
      return candidate;
    } catch {
      // try the next one
    }
  }
  throw new Error(`${name} not found (looked on PATH and at ${fallback})`);
}
