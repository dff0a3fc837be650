/**
 * The agent must not start with inheritable or ambient capabilities. Every way into a desktop
 * trims the capability bounding set to the guest's own (guest-init.ts `GUEST_CAPS`), but for a
 * process of uid 0 the kernel grants at exec the bounding set *and* the inheritable set: an agent
 * started with `CAP_SYS_ADMIN` inheritable (a unit with `CapabilityInheritable=` or
 * `AmbientCapabilities=`, some container runtimes' privileged mode) would hand it to every exec,
 * terminal and VNC server it starts in a desktop, which is a way out of the desktop. The sandbox
 * driver refuses to start instead, saying how to start the agent; a default install
 * (scripts/install-agent's unit) has neither.
 */
import { readFile } from 'node:fs/promises';
import { GUEST_CAP_MASK } from '../guest/guest-init.js';

/** The inheritable and ambient capability masks a `/proc/<pid>/status` text shows. */
export function inheritedCapabilities(status: string): { inheritable: bigint; ambient: bigint } {
  const mask = (name: string) => BigInt(`0x${new RegExp(`^${name}:\\s*([0-9a-f]+)$`, 'm').exec(status)?.[1] ?? '0'}`);
  return { inheritable: mask('CapInh'), ambient: mask('CapAmb') };
}

/**
 * Throws when this process holds inheritable or ambient capabilities a guest may not have (those
 * in the guest's own set it has anyway: an `AmbientCapabilities=CAP_NET_BIND_SERVICE` is harmless).
 */
export async function refuseInheritedCapabilities(status?: string): Promise<void> {
  const { inheritable, ambient } = inheritedCapabilities(status ?? (await readFile('/proc/self/status', 'utf8')));
  if (((inheritable | ambient) & ~BigInt(GUEST_CAP_MASK)) === 0n) return;
  throw new Error(
    `the agent runs with inheritable (0x${inheritable.toString(16)}) or ambient (0x${ambient.toString(16)}) capabilities, which every process ` +
      "it starts in a desktop would get past the desktop's own: start it without them (systemd: no CapabilityInheritable= or AmbientCapabilities=)",
  );
}
