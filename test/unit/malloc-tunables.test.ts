import { describe, expect, it } from 'vitest';
import { MALLOC_TUNABLES, withMallocTunables } from '../../shared/src/malloc-tunables.js';

const ours = Object.entries(MALLOC_TUNABLES).map(([name, value]) => `${name}=${value}`);

describe('withMallocTunables', () => {
  it('gives the settings when none are set', () => {
    expect(withMallocTunables(undefined)).toBe(ours.join(':'));
    expect(withMallocTunables('')).toBe(ours.join(':'));
  });

  it('keeps what is set and adds ours after it', () => {
    expect(withMallocTunables('glibc.malloc.arena_max=2')).toBe(['glibc.malloc.arena_max=2', ...ours].join(':'));
  });

  it('leaves a tunable the operator set at their value', () => {
    const merged = withMallocTunables('glibc.malloc.trim_threshold=1048576');
    expect(merged.split(':')).toContain('glibc.malloc.trim_threshold=1048576');
    expect(merged.split(':').filter((entry) => entry.startsWith('glibc.malloc.trim_threshold='))).toHaveLength(1);
    expect(merged.split(':')).toContain(ours[0]);
  });
});
