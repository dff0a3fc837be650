/**
 * The sandbox runtime driver (namespaces + bubblewrap + CRIU). See sandbox-driver.ts for the idea
 * and OPERATORS-NOTES.md for the on-disk layout.
 */
import { SandboxDriver, type SandboxDriverOptions } from './sandbox-driver.js';

export { SandboxDriver, type SandboxDriverOptions };

export function createSandboxDriver(options: SandboxDriverOptions): Promise<SandboxDriver> {
  return SandboxDriver.create(options);
}
