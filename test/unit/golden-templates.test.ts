/**
 * The template bookkeeping of golden templates (host/golden.ts) over a stand-in lifecycle that
 * only makes and removes directories: which template a creation clones, when one is built, and
 * when creations boot cold instead. The real boots, dumps and restores are in
 * test/integration/sandbox-golden.test.ts.
 */
import { copyFile, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { GoldenTemplates, type TemplateLifecycle } from '../../agent/src/runtime/sandbox/host/golden.js';
import { desktopPaths, TEMPLATE_CLONE_FILE } from '../../agent/src/runtime/sandbox/host/layout.js';
import { newId } from '../../shared/src/ids.js';

let stateDir: string;

beforeEach(async () => {
  stateDir = await mkdtemp(join(tmpdir(), 'canto-golden-unit-'));
});

afterEach(async () => {
  await rm(stateDir, { recursive: true, force: true });
});

/** Disks as directories with the ready marker; a fork copies the clone marker, as createFork does. */
function standIn(): TemplateLifecycle & { readonly calls: string[] } {
  const calls: string[] = [];
  const disk = async (id: string) => {
    await mkdir(desktopPaths(stateDir, id).dir, { recursive: true });
    await writeFile(join(desktopPaths(stateDir, id).dir, '.ready'), '');
  };
  return {
    calls,
    prepare: async (id) => {
      calls.push(`prepare ${id}`);
      await disk(id);
    },
    start: async () => ({ restored: false }),
    hibernate: async () => ({ snapshot: true }),
    fork: async (source, ids) => {
      for (const id of ids) {
        calls.push(`fork ${source} ${id}`);
        await disk(id);
        await copyFile(join(desktopPaths(stateDir, source).dir, TEMPLATE_CLONE_FILE), join(desktopPaths(stateDir, id).dir, TEMPLATE_CLONE_FILE));
      }
      return { snapshot: true };
    },
    destroy: async (id) => {
      calls.push(`destroy ${id}`);
      await rm(desktopPaths(stateDir, id).dir, { recursive: true, force: true });
    },
  };
}

describe('golden templates', () => {
  it('replaces a template whose clone failed, and boots creations cold when a clone of the new one fails too', async () => {
    const lifecycle = standIn();
    const logged: string[] = [];
    const golden = await GoldenTemplates.open(stateDir, { path: '/usr/local/sbin/criu', version: '4.1' }, lifecycle, (msg) => logged.push(msg));
    const first = await golden.whenReady();
    expect(first).not.toBeNull();

    const a = newId('desktop');
    await golden.prepare(a, 'small');
    expect(lifecycle.calls).toContain(`fork ${first} ${a}`);
    await golden.cloneFailed(a);
    expect(lifecycle.calls).toContain(`destroy ${first}`);
    const second = await golden.whenReady();
    expect(second).not.toBeNull();
    expect(second).not.toBe(first);

    const b = newId('desktop');
    await golden.prepare(b, 'small');
    expect(lifecycle.calls).toContain(`fork ${second} ${b}`);
    await golden.cloneFailed(b);
    expect(lifecycle.calls).toContain(`destroy ${second}`);
    expect(logged).toContain('clones of a fresh desktop template fail to restore too: new desktops boot cold');

    // No third build: the next creation gets an empty disk of its own and nothing is built.
    const before = lifecycle.calls.length;
    const c = newId('desktop');
    await golden.prepare(c, 'small');
    expect(await golden.whenReady()).toBeNull();
    expect(lifecycle.calls.slice(before)).toEqual([`prepare ${c}`]);
    await golden.close();
  });

  it('ignores a failed restore of a clone of a template already replaced', async () => {
    const lifecycle = standIn();
    const golden = await GoldenTemplates.open(stateDir, { path: '/usr/local/sbin/criu', version: '4.1' }, lifecycle, () => undefined);
    const first = await golden.whenReady();
    const [a, b] = [newId('desktop'), newId('desktop')];
    await golden.prepare(a, 'small');
    await golden.prepare(b, 'small');
    // Two clones of one template failing together are one failure: one rebuild, no back-off.
    await golden.cloneFailed(a);
    await golden.cloneFailed(b);
    const second = await golden.whenReady();
    expect(second).not.toBeNull();
    expect(second).not.toBe(first);
    expect(lifecycle.calls.filter((c) => c.startsWith('destroy '))).toEqual([`destroy ${first}`]);
    await golden.close();
  });
});
