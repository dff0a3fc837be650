/** The agent's on/off settings (agent/src/env-switch.ts) read every spelling alike. */
import { afterEach, expect, it } from 'vitest';
import { parseSwitch, runtimeSwitch } from '../../agent/src/env-switch.js';

const saved = process.env.CANTO_AGENT_CGROUP_FAVOR_DYNMODS;
afterEach(() => {
  if (saved === undefined) delete process.env.CANTO_AGENT_CGROUP_FAVOR_DYNMODS;
  else process.env.CANTO_AGENT_CGROUP_FAVOR_DYNMODS = saved;
});

it('reads on and off in every spelling, unset as the default, and refuses anything else', () => {
  for (const on of ['on', 'ON', 'true', '1', 'yes', ' Yes ']) expect(parseSwitch('X', on, false)).toBe(true);
  for (const off of ['off', 'False', '0', 'no']) expect(parseSwitch('X', off, true)).toBe(false);
  expect(parseSwitch('X', undefined, true)).toBe(true);
  expect(parseSwitch('X', '', false)).toBe(false);
  expect(() => parseSwitch('X', 'disabled', true)).toThrow('X must be on or off');
});

it('turns a runtime switch off with 0, which used to be read as on', () => {
  process.env.CANTO_AGENT_CGROUP_FAVOR_DYNMODS = '0';
  expect(runtimeSwitch('CANTO_AGENT_CGROUP_FAVOR_DYNMODS')).toBe(false);
  delete process.env.CANTO_AGENT_CGROUP_FAVOR_DYNMODS;
  expect(runtimeSwitch('CANTO_AGENT_CGROUP_FAVOR_DYNMODS')).toBe(true);
});
