import { defineConfig } from 'tsup';

// One bundle for the `canto` CLI: scheduler, agent and shared code are bundled; npm dependencies
// stay external so native modules (sharp) load from node_modules.
export default defineConfig({
  entry: { cli: 'cli/src/main.ts' },
  format: ['esm'],
  platform: 'node',
  target: 'node20',
  outDir: 'dist',
  sourcemap: true,
  clean: true,
  banner: { js: '#!/usr/bin/env node' },
});
