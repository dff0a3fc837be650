/**
 * On/off settings of the agent. Most are read once into the agent's config (config.ts); a few
 * are read where the runtime uses them (`runtimeSwitch`), which tests set per process. Both accept
 * the same spellings and refuse anything else: a typo such as `CANTO_AGENT_SPAWN_HELPER=of` must
 * stop the agent at its start, not be read as "on". loadAgentConfig checks the runtime ones too.
 */

/** Switches the runtime reads from the environment where it uses them, with their defaults. */
export const RUNTIME_SWITCHES = {
  CANTO_AGENT_SPAWN_HELPER: true,
  CANTO_AGENT_NATIVE_ENTRY: true,
  CANTO_AGENT_CGROUP_FAVOR_DYNMODS: true,
  CANTO_AGENT_RAISE_SHARED_LIMITS: true,
} as const;

/** `raw` as a switch: true/1/yes/on, false/0/no/off (any case), unset or empty the fallback. */
export function parseSwitch(name: string, raw: string | undefined, fallback: boolean): boolean {
  const value = raw?.trim().toLowerCase();
  if (value === undefined || value === '') return fallback;
  if (['true', '1', 'yes', 'on'].includes(value)) return true;
  if (['false', '0', 'no', 'off'].includes(value)) return false;
  throw new Error(`agent config: ${name} must be on or off (true/false, 1/0, yes/no), got "${raw}"`);
}

export function runtimeSwitch(name: keyof typeof RUNTIME_SWITCHES): boolean {
  return parseSwitch(name, process.env[name], RUNTIME_SWITCHES[name]);
}
