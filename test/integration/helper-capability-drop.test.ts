/**
 * The guest helper's drop to the guest's capabilities (agent/guest/helper/prelude.pl), run on
 * the host as a cold helper would run in a guest: it keeps the guest's set within what it was
 * given, so a host that withholds one of the guest's capabilities (a hardened container without
 * NET_RAW, say) still gets its file operations served. Needs root (setpriv changes the bounding set).
 */
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { guestHelperProgram } from '../../agent/src/runtime/sandbox/guest/guest-helper.js';
import { isRoot } from '../helpers/sandbox.js';

describe.skipIf(!isRoot)('the helper capability drop', () => {
  const stat = (bounding: string[]) =>
    execFileSync('setpriv', [...bounding, 'perl', '-e', guestHelperProgram('stat'), 'stat', '/'], { encoding: 'utf8' });

  it('serves with every capability given, and with one of the guest set withheld', () => {
    expect(stat([])).toMatch(/^OK directory /);
    expect(stat(['--bounding-set=-net_raw,-kill'])).toMatch(/^OK directory /);
  });
});
