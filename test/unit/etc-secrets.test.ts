/**
 * The scan of the host's /etc for what a guest must not read (guest/etc-secrets.ts): files others
 * may not read, directories others may not list or enter (not descended into), and nothing else —
 * symlinks, world-readable files and what lies inside a covered directory are left alone.
 */
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { scanEtcSecrets } from '../../agent/src/runtime/sandbox/guest/etc-secrets.js';

const root = mkdtempSync(join(tmpdir(), 'canto-etc-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('scanEtcSecrets', () => {
  it('finds the files and directories only their owner or group may read', () => {
    const file = (path: string, mode: number) => {
      writeFileSync(join(root, path), 'x');
      chmodSync(join(root, path), mode);
    };
    const dir = (path: string, mode: number) => {
      mkdirSync(join(root, path));
      chmodSync(join(root, path), mode);
    };
    file('hosts', 0o644);
    file('shadow', 0o640);
    dir('canto', 0o755);
    file('canto/agent.env', 0o600);
    file('canto/public.conf', 0o644);
    dir('ssl', 0o755);
    dir('ssl/private', 0o700);
    file('ssl/private/key.pem', 0o600);
    // Others may enter but not list it: its names are not theirs to learn.
    dir('sudoers.d', 0o711);
    symlinkSync('/nonexistent/secret', join(root, 'dangling'));
    symlinkSync('shadow', join(root, 'shadow-link'));

    expect(scanEtcSecrets(root)).toEqual({
      files: [join(root, 'canto/agent.env'), join(root, 'shadow')],
      dirs: [join(root, 'ssl/private'), join(root, 'sudoers.d')],
    });
  });

  it('answers nothing for a tree that is not there', () => {
    expect(scanEtcSecrets(join(root, 'missing'))).toEqual({ files: [], dirs: [] });
  });
});
