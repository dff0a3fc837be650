/**
 * `/etc/hosts`, read the way getaddrinfo reads it before DNS: webhook names are resolved without
 * getaddrinfo (guarded-connect.ts says why), and a name the host maps there (the machine's own
 * name, a split-horizon entry) must still get the addresses it names, and the guard's verdict on
 * them. Read again when the file's modification time changes, at most once a second.
 */
import { readFile, stat } from 'node:fs/promises';
import { isIP } from 'node:net';

const RECHECK_MS = 1_000;

export class HostsFile {
  private names = new Map<string, string[]>();
  private mtimeMs = -1;
  private checkedAt = -Infinity;

  constructor(private readonly path = '/etc/hosts') {}

  /** The addresses the file gives `name` (lower-cased, no trailing dot), in file order; [] if none. */
  async lookup(name: string): Promise<string[]> {
    await this.refresh();
    return this.names.get(name) ?? [];
  }

  private async refresh(): Promise<void> {
    if (performance.now() - this.checkedAt < RECHECK_MS) return;
    this.checkedAt = performance.now();
    const mtimeMs = await stat(this.path).then((s) => s.mtimeMs, () => null);
    if (mtimeMs === this.mtimeMs) return;
    this.mtimeMs = mtimeMs ?? -1;
    this.names = mtimeMs === null ? new Map() : parseHosts(await readFile(this.path, 'utf8').catch(() => ''));
  }
}

/** `address name [alias…]` lines, `#` comments; every name of a line maps to its address. */
export function parseHosts(text: string): Map<string, string[]> {
  const names = new Map<string, string[]>();
  for (const line of text.split('\n')) {
    const [address, ...aliases] = line.replace(/#.*/, '').trim().split(/\s+/);
    if (!address || aliases.length === 0 || isIP(address) === 0) continue;
    for (const alias of aliases) {
      const name = alias.toLowerCase().replace(/\.$/, '');
      const known = names.get(name) ?? [];
      if (!known.includes(address)) known.push(address);
      names.set(name, known);
    }
  }
  return names;
}
