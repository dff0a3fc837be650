import { execFileSync } from 'node:child_process';
import { cpSync } from 'node:fs';
import { defineConfig } from 'tsup';

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
      const sources = ['canto-spawn.c', 'keeper.c', 'restore-action.c', 'handoff.c', 'port-relay.c', 'guest-enter.c', 'spawn-paths.c', 'clean-fds.c'].map((f) => `agent/native/${f}`);
      execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', 'dist/canto-spawn', ...sources], { stdio: 'inherit' });
    } catch (err) {
      console.warn(`canto-spawn not built (${(err as Error).message}): the agent will start processes with Node's spawn`);
    }
  },
});
