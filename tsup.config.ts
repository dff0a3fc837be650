import { cpSync } from 'node:fs';
import { defineConfig } from 'tsup';

// One bundle for the `canto` CLI: scheduler, agent and shared code are bundled; npm dependencies
// stay external so native modules (sharp) load from node_modules. The guest programs (Perl, shell
// and awk files the agent runs in desktops) are copied beside it, to dist/guest/, where
// agent/src/runtime/sandbox/guest/guest-programs.ts reads them. The web console (static HTML, CSS and
// ES modules) is copied to dist/console/, where scheduler/src/http/routes/console.ts serves it. The
// schema migrations (SQL files) are copied to dist/migrations/, where
// scheduler/src/store/migrations.ts reads them.
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
  },
});
