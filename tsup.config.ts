import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defineConfig } from 'tsup';

const SPAWNER_SOURCES = ['canto-spawn.c', 'keeper.c', 'restore-action.c', 'handoff.c', 'port-relay.c', 'guest-enter.c', 'spawn-paths.c', 'clean-fds.c', 'guest-filter.c', 'proc-seal.c', 'modes.c'].map((f) => `agent/native/${f}`);
const C_FLAGS = ['-O2', '-Wall', '-Wextra', '-Werror'];

/**
 * Builds the spawner statically against musl where `musl-gcc` is installed, and with `cc` (glibc,
 * dynamic) otherwise. The spawner is started anew for every CRIU hook (seven per wake): glibc's
 * start-up (its dynamic loader, and the CPUID instructions with which it sizes the caches, each
 * a trap to the hypervisor on a VM) cost ≈0.9 ms of CPU per start here, a static musl binary
 * ≈0.06 ms. musl's headers leave out the kernel's (`linux/…`), which come from the system's.
 */
function buildSpawner(): void {
  const kernelHeaders = muslKernelHeaders();
  if (kernelHeaders !== null) {
    try {
      execFileSync('musl-gcc', ['-static', ...C_FLAGS, '-idirafter', kernelHeaders, '-o', 'dist/canto-spawn', ...SPAWNER_SOURCES], { stdio: 'inherit' });
      return;
    } catch (err) {
      console.warn(`canto-spawn: the musl build failed (${(err as Error).message}); building it with cc`);
    } finally {
      rmSync(kernelHeaders, { recursive: true, force: true });
    }
  }
  execFileSync('cc', [...C_FLAGS, '-o', 'dist/canto-spawn', ...SPAWNER_SOURCES], { stdio: 'inherit' });
}

/** A directory holding the system's kernel headers for musl-gcc, or null without musl-gcc or them. */
function muslKernelHeaders(): string | null {
  let arch: string;
  try {
    execFileSync('musl-gcc', ['--version'], { stdio: 'ignore' });
    arch = execFileSync('cc', ['-print-multiarch'], { encoding: 'utf8' }).trim();
  } catch {
    return null;
  }
  const links: Array<[string, string]> = [['linux', '/usr/include/linux'], ['asm-generic', '/usr/include/asm-generic'], ['asm', `/usr/include/${arch}/asm`]];
  if (!links.every(([, target]) => existsSync(target))) return null;
  let dir: string | null = null;
  try {
    dir = mkdtempSync(join(tmpdir(), 'canto-kernel-headers-'));
    for (const [name, target] of links) symlinkSync(target, join(dir, name));
    return dir;
  } catch (err) {
    // No musl build then, but still the `cc` one.
    console.warn(`canto-spawn: no musl build (${(err as Error).message})`);
    if (dir !== null) rmSync(dir, { recursive: true, force: true });
    return null;
  }
}

// One bundle for the `canto` CLI: scheduler, agent and shared code are bundled; npm dependencies
// stay external so native modules (sharp) load from node_modules. The guest programs (Perl, shell
// and awk files the agent runs in desktops) are copied beside it, to dist/guest/, where
// agent/src/runtime/sandbox/guest/guest-programs.ts reads them. The web console (static HTML, CSS and
// ES modules) is copied to dist/console/, where scheduler/src/http/routes/console.ts serves it. The
// schema migrations (SQL files) are copied to dist/migrations/, where
// scheduler/src/store/migrations.ts reads them. The agent's process spawner (a small C program,
// agent/native/) is compiled to dist/canto-spawn, where
// agent/src/runtime/sandbox/host/spawner.ts finds it; without a C compiler the agent starts
// processes with Node's spawn instead.
export default defineConfig({
  entry: { cli: 'cli/src/main.ts' },
  format: ['esm'],
  platform: 'node',
  target: 'node20',
  outDir: 'dist',
  sourcemap: true,
  clean: true,
  banner: { js: '#!/usr/bin/env node' },
  async onSuccess() {
    cpSync('agent/guest', 'dist/guest', { recursive: true });
    cpSync('console', 'dist/console', { recursive: true });
    cpSync('scheduler/src/store/migrations', 'dist/migrations', { recursive: true });
    try {
      buildSpawner();
    } catch (err) {
      console.warn(`canto-spawn not built (${(err as Error).message}): the agent will start processes with Node's spawn`);
    }
  },
});
