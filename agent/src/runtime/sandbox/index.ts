/**
 * The sandbox runtime driver (namespaces + bubblewrap + CRIU). See sandbox-driver.ts for the idea
 * and docs/operators.md ("On-disk layout") for the files it keeps.
 */
import { SandboxDriver, type SandboxDriverOptions } from './sandbox-driver.js';

export { SandboxDriver, type SandboxDriverOptions };
export { releaseIdleDisks } from './host/layers.js';
export { sweepDiscarded } from './host/discarded.js';

export function createSandboxDriver(options: SandboxDriverOptions): Promise<SandboxDriver> {
  return SandboxDriver.create(options);
}
