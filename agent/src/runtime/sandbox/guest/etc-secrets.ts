/**
 * What of the host's `/etc` a guest must not read. Every desktop sees the host's `/etc` read-only,
 * and a guest is root inside its namespaces with `CAP_DAC_OVERRIDE`: it reads what the host's root
 * reads there, which includes the agent's own join token (`/etc/canto/agent.env`, mode 0600), SSH
 * host keys, TLS keys and whatever secrets an operator keeps in `/etc`. The rule is the one an
 * unprivileged host user lives by: a regular file others may not read, or a directory others may
 * not list or enter, is covered for the guest (a file by `/dev/null`, a directory by an empty one),
 * and what is left is what any user of the host could read anyway.
 *
 * The scan reads every entry of `/etc` (about 1,400 on a Debian host: 15-30 ms), so it runs once
 * per agent process, at the first boot: a secret put in `/etc` later is covered for desktops booted
 * after the agent's next start. A restored or moved desktop keeps the covers its image names, a
 * secret the host deleted since included (host/criu.ts records what each cover is made of, and the
 * view of `/etc` keeps the names: host/etc-view.ts); one found after its dump is hidden by the view.
 */
import { lstatSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

export interface EtcSecrets {
  /** Regular files others may not read. */
  readonly files: readonly string[];
  /** Directories others may not list or enter (their contents are not scanned). */
  readonly dirs: readonly string[];
}

/** A tree this big is not a host's `/etc`: the rest is left unscanned rather than stall a boot. */
const MAX_ENTRIES = 50_000;

/** Scans `root` (the host's `/etc`); entries that vanish meanwhile are skipped. */
export function scanEtcSecrets(root = '/etc'): EtcSecrets {
  const files: string[] = [];
  const dirs: string[] = [];
  let seen = 0;
  const walk = (dir: string) => {
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch {
      return;
    }
    for (const name of names.sort()) {
      if (++seen > MAX_ENTRIES) return;
      const path = join(dir, name);
      let st;
      try {
        st = lstatSync(path);
      } catch {
        continue;
      }
      if (st.isDirectory()) {
        if ((st.mode & 0o005) !== 0o005) dirs.push(path);
        else walk(path);
      } else if (st.isFile() && (st.mode & 0o004) === 0) {
        files.push(path);
      }
    }
  };
  walk(root);
  return { files, dirs };
}

let cached: EtcSecrets | null = null;

/** The host's `/etc` secrets as this agent process first found them. */
export function hostEtcSecrets(): EtcSecrets {
  cached ??= scanEtcSecrets();
  return cached;
}

/** The next `hostEtcSecrets` scans again, as a new agent process does (tests of a restart). */
export function forgetEtcSecretsScan(): void {
  cached = null;
}
