/**
 * The source agent of the move benchmark (move.ts), as a process of its own as in production, so
 * the sending side has its own event loop: a sandbox host (test/helpers/move-hosts.ts) driven over
 * the IPC channel. `setup` makes a hibernated desktop with `mib` MiB of random data written,
 * `export` exports it at a new generation, `copy` times `cp -a` of its directory, `close` ends.
 */
import { execFileSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { newId } from '../../shared/src/ids.js';
import { startMoveHost } from '../helpers/move-hosts.js';

type Message = { type: 'setup'; mib: number } | { type: 'export'; listing: 'hashed' | 'sized' } | { type: 'copy'; to: string } | { type: 'close' };

const host = await startMoveHost(process.argv[2]!);
const id = newId('desktop');
let generation = 0;
const op = () => ({ desktop_id: id, generation: ++generation, operation_id: `op_${generation}` });
const reply = (value: unknown) => process.send?.(value);

async function handle(m: Message): Promise<unknown> {
  switch (m.type) {
    case 'setup': {
      await host.handlers.handle('desktop.prepare', { ...op(), tier: 'small' });
      await host.handlers.handle('desktop.start', { ...op(), tier: 'small', first_boot: null });
      const out = await host.driver.exec(id, { command: `head -c ${m.mib << 20} /dev/urandom > /root/data`, timeoutMs: 120_000, maxOutputBytes: 4096 });
      if (out.exitCode !== 0) throw new Error(`writing the data failed: ${out.stderr}`);
      await host.handlers.handle('desktop.hibernate', op());
      return { id };
    }
    case 'export': {
      const t0 = performance.now();
      const result = await host.handlers.handle('desktop.export', { desktop_id: id, generation: ++generation, ttl_ms: 600_000, listing: m.listing });
      return { result, generation, ms: performance.now() - t0 };
    }
    case 'copy': {
      const t0 = performance.now();
      execFileSync('cp', ['-a', join(host.state, 'runtime', 'desktops', id), m.to]);
      const ms = performance.now() - t0;
      rmSync(m.to, { recursive: true, force: true });
      return { ms };
    }
    case 'close': {
      for (const d of await host.driver.list()) await host.driver.destroy(d.desktopId);
      await host.close();
      setImmediate(() => process.exit(0));
      return {};
    }
  }
}

process.on('message', (m: Message) => {
  handle(m).then(
    (value) => reply({ ok: true, value }),
    (err: unknown) => reply({ ok: false, error: err instanceof Error ? err.message : String(err) }),
  );
});
reply({ ok: true, value: 'ready' });
