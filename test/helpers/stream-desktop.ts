/**
 * A running sandbox desktop with the agent's stream gateway in front of it on 127.0.0.1: what the
 * VNC and terminal tests on the real machine start from. `close` destroys the desktop and removes
 * the state directory. Needs root.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { newId } from '../../shared/src/ids.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { StreamGateway, type StreamGatewayOptions } from '../../agent/src/stream/gateway.js';

export interface StreamDesktop {
  readonly driver: SandboxDriver;
  readonly gateway: StreamGateway;
  readonly id: string;
  /** The driver's state directory (a second driver on it stands for a restarted agent). */
  readonly stateDir: string;
  close(): Promise<void>;
}

/** `extra`: gateway options beyond the VNC opener (terminals, generations), given the driver. */
export async function startStreamDesktop(
  prefix: string,
  extra: (driver: SandboxDriver) => Partial<StreamGatewayOptions> = () => ({}),
): Promise<StreamDesktop> {
  const base = await mkdtemp(join(tmpdir(), prefix));
  const stateDir = join(base, 'state');
  const driver = await createSandboxDriver({ stateDir });
  const id = newId('desktop');
  let gateway: StreamGateway | null = null;
  const close = async () => {
    await gateway?.close();
    await driver.destroy(id).catch(() => undefined);
    await driver.close();
    await rm(base, { recursive: true, force: true });
  };
  try {
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    gateway = await StreamGateway.start({
      listenHost: '127.0.0.1',
      port: 0,
      advertiseHost: '127.0.0.1',
      open: (desktopId, viewOnly) => driver.openVnc(desktopId, viewOnly),
      log: () => undefined,
      ...extra(driver),
    });
  } catch (err) {
    await close();
    throw err;
  }
  return { driver, gateway, id, stateDir, close };
}
