/** Guest path normalization and the exec / tail clamps (docs/api.md §4.3, 4.4, 8). */
import { describe, expect, it } from 'vitest';
import { ApiError } from '../../scheduler/src/errors.js';
import { apiPath, guestPath } from '../../scheduler/src/http/guest-paths.js';
import { clampExecTimeoutSecs, clampTailBytes } from '../../scheduler/src/services/guest.js';

function status(fn: () => unknown): number | null {
  try {
    fn();
    return null;
  } catch (err) {
    return err instanceof ApiError ? err.status : -1;
  }
}

describe('guestPath', () => {
  it('makes the captured path absolute and drops empty and . segments', () => {
    expect(guestPath('root/a.txt')).toBe('/root/a.txt');
    expect(guestPath('root//a/./b/')).toBe('/root/a/b');
    expect(guestPath('/etc')).toBe('/etc');
    expect(guestPath('.')).toBe('/');
    expect(guestPath('', { allowEmpty: true })).toBe('/');
    expect(guestPath('root/..hidden/x..')).toBe('/root/..hidden/x..');
    expect(apiPath(guestPath('root/a'))).toBe('root/a');
    expect(apiPath('/')).toBe('');
  });

  it('refuses empty, NUL, .. and over-long paths, and the root where it is not allowed', () => {
    expect(status(() => guestPath(''))).toBe(400);
    expect(status(() => guestPath('root/a\0b'))).toBe(400);
    expect(status(() => guestPath('root/../etc'))).toBe(400);
    expect(status(() => guestPath('..'))).toBe(400);
    expect(status(() => guestPath('a/'.repeat(2100)))).toBe(400);
    for (const root of ['.', '/', './.', '//']) expect(status(() => guestPath(root, { refuseRoot: true }))).toBe(400);
    expect(status(() => guestPath('root', { refuseRoot: true }))).toBeNull();
  });
});

describe('clamps', () => {
  it('timeout_secs: default 60, rounded up, within 1..300, never rejected', () => {
    expect(clampExecTimeoutSecs(undefined)).toBe(60);
    expect(clampExecTimeoutSecs(null)).toBe(60);
    expect(clampExecTimeoutSecs(0)).toBe(1);
    expect(clampExecTimeoutSecs(-5)).toBe(1);
    expect(clampExecTimeoutSecs(0.2)).toBe(1);
    expect(clampExecTimeoutSecs(2.5)).toBe(3);
    expect(clampExecTimeoutSecs(300)).toBe(300);
    expect(clampExecTimeoutSecs(1e9)).toBe(300);
  });

  it('tail_bytes: omitted or 0 gives 64 KiB, capped at 512 KiB', () => {
    expect(clampTailBytes(undefined)).toBe(65_536);
    expect(clampTailBytes(0)).toBe(65_536);
    expect(clampTailBytes(10)).toBe(10);
    expect(clampTailBytes(10_000_000)).toBe(524_288);
  });
});
