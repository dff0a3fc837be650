/**
 * glibc malloc settings for Canto's long-running Node processes, passed in `GLIBC_TUNABLES`
 * (glibc reads it once, when a process starts, so it is set where Canto starts one: the
 * scheduler's cluster workers, the agent's systemd unit).
 *
 * Streaming file bytes allocates and frees the same sizes over and over: 64 KiB socket reads, and
 * 1 MiB websocket messages reassembled from them. By default glibc raises its mmap threshold as
 * large blocks are freed and gives memory above the heap's top back to the kernel once more than
 * twice that threshold is free there, so a process moving megabytes keeps returning the heap's
 * top and faulting it back in, zeroed, page by page. A scheduler worker spent 15-20 ms of CPU per
 * 8 MiB download that way, against 8-10 ms with these settings (page faults and page clearing
 * gone from its profile). Fixed thresholds end the cycle: blocks under 4 MiB come from the heap,
 * and up to 32 MiB of free memory stays at its top, which bounds what a process keeps.
 */

export const MALLOC_TUNABLES: Readonly<Record<string, string>> = {
  'glibc.malloc.mmap_threshold': String(4 << 20),
  'glibc.malloc.trim_threshold': String(32 << 20),
};

/** `current` (a `GLIBC_TUNABLES` value, or none) with ours added; a tunable it sets already keeps its value. */
export function withMallocTunables(current: string | undefined): string {
  const entries = (current ?? '').split(':').filter((entry) => entry !== '');
  const named = new Set(entries.map((entry) => entry.split('=')[0]));
  for (const [name, value] of Object.entries(MALLOC_TUNABLES)) {
    if (!named.has(name)) entries.push(`${name}=${value}`);
  }
  return entries.join(':');
}
