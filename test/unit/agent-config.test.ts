import { availableParallelism, hostname } from 'node:os';
import { describe, expect, it } from 'vitest';
import { agentSocketUrl } from '../../agent/src/channel.js';
import { loadAgentConfig } from '../../agent/src/config.js';

const base = { CANTO_SCHEDULER_URL: 'http://sched.example:8080/', CANTO_AGENT_TOKEN: 'tok' };

describe('loadAgentConfig', () => {
  it('applies documented defaults and freezes the result', () => {
    const config = loadAgentConfig(base);
    expect(config).toEqual({
      schedulerUrls: ['http://sched.example:8080'],
      token: 'tok',
      stateDir: '/var/lib/canto-agent',
      runtime: 'sandbox',
      memorySnapshots: true,
      goldenTemplates: true,
      lifecycleSlots: Math.max(4, 4 * availableParallelism()),
      heartbeatMs: 1000,
      reconnectMinMs: 100,
      reconnectMaxMs: 2_000,
      logLevel: 'info',
      streamListen: { host: '0.0.0.0', port: 7010 },
      ingressListen: { host: '0.0.0.0', port: 7011 },
      metricsListen: { host: '127.0.0.1', port: 7012 },
      transferListen: { host: '0.0.0.0', port: 7013 },
      address: hostname(),
    });
    expect(Object.isFrozen(config)).toBe(true);
  });

  it('takes the stream gateway address as host:port, or off', () => {
    const at = (value: string) => loadAgentConfig({ ...base, CANTO_AGENT_STREAM_LISTEN: value }).streamListen;
    expect(at('127.0.0.1:0')).toEqual({ host: '127.0.0.1', port: 0 });
    expect(at('[::1]:7011')).toEqual({ host: '::1', port: 7011 });
    expect(at('off')).toBeNull();
    for (const bad of ['7010', 'host:', 'host:70000', ':7010', 'a b:1']) {
      expect(() => at(bad), bad).toThrow(/CANTO_AGENT_STREAM_LISTEN/);
    }
    expect(loadAgentConfig({ ...base, CANTO_AGENT_ADDRESS: 'desk-7.example' }).address).toBe('desk-7.example');
    expect(loadAgentConfig({ ...base, CANTO_AGENT_TRANSFER_LISTEN: 'off' }).transferListen).toBeNull();
    expect(loadAgentConfig({ ...base, CANTO_AGENT_TRANSFER_LISTEN: '10.0.0.5:0' }).transferListen).toEqual({ host: '10.0.0.5', port: 0 });
    expect(() => loadAgentConfig({ ...base, CANTO_AGENT_TRANSFER_LISTEN: '7013' })).toThrow(/CANTO_AGENT_TRANSFER_LISTEN/);
  });

  it('takes the lifecycle bound as a whole number, 0 for none', () => {
    const slots = (value: string) => loadAgentConfig({ ...base, CANTO_AGENT_LIFECYCLE_CONCURRENCY: value }).lifecycleSlots;
    expect([slots('3'), slots('0'), slots(' 12 ')]).toEqual([3, 0, 12]);
    for (const bad of ['-1', '1.5', 'many', '1e3']) expect(() => slots(bad), bad).toThrow(/CANTO_AGENT_LIFECYCLE_CONCURRENCY/);
  });

  it('prefers flags over the environment', () => {
    const config = loadAgentConfig(
      { ...base, CANTO_AGENT_STATE_DIR: '/env', CANTO_AGENT_RUNTIME: 'sandbox', CANTO_AGENT_MEMORY_SNAPSHOTS: 'false' },
      { scheduler: 'https://other.example', token: 'flag-token', stateDir: '/flag', runtime: 'fake', logLevel: 'debug' },
    );
    expect(config).toMatchObject({
      schedulerUrls: ['https://other.example'],
      token: 'flag-token',
      stateDir: '/flag',
      runtime: 'fake',
      memorySnapshots: false,
      logLevel: 'debug',
    });
  });

  it('takes a comma-separated list of scheduler replicas', () => {
    const config = loadAgentConfig({ ...base, CANTO_SCHEDULER_URL: 'http://a.example:8080/, https://b.example' });
    expect(config.schedulerUrls).toEqual(['http://a.example:8080', 'https://b.example']);
    expect(() => loadAgentConfig({ ...base, CANTO_SCHEDULER_URL: 'http://a.example,ftp://b' })).toThrow(/http or https/);
  });

  it('throws a clear error for missing or invalid values', () => {
    expect(() => loadAgentConfig({ CANTO_AGENT_TOKEN: 'tok' })).toThrow(/scheduler URL is required/);
    expect(() => loadAgentConfig({ CANTO_SCHEDULER_URL: 'http://x' })).toThrow(/join token is required/);
    expect(() => loadAgentConfig({ ...base, CANTO_SCHEDULER_URL: 'ftp://x' })).toThrow(/http or https/);
    expect(() => loadAgentConfig({ ...base, CANTO_SCHEDULER_URL: 'not a url' })).toThrow(/not a valid URL/);
    expect(() => loadAgentConfig({ ...base, CANTO_SCHEDULER_URL: 'http://u:p@x' })).toThrow(/credentials/);
    expect(() => loadAgentConfig({ ...base, CANTO_AGENT_RUNTIME: 'qemu' })).toThrow(/sandbox" or "fake/);
    expect(() => loadAgentConfig({ ...base, CANTO_AGENT_MEMORY_SNAPSHOTS: 'maybe' })).toThrow(/CANTO_AGENT_MEMORY_SNAPSHOTS must be on or off/);
    // The switches the runtime reads where it uses them are checked at the start too.
    for (const name of ['CANTO_AGENT_SPAWN_HELPER', 'CANTO_AGENT_NATIVE_ENTRY', 'CANTO_AGENT_CGROUP_FAVOR_DYNMODS', 'CANTO_AGENT_RAISE_SHARED_LIMITS']) {
      expect(() => loadAgentConfig({ ...base, [name]: 'of' })).toThrow(`${name} must be on or off (true/false, 1/0, yes/no), got "of"`);
      expect(() => loadAgentConfig({ ...base, [name]: '0' })).not.toThrow();
    }
    expect(() => loadAgentConfig({ ...base, CANTO_AGENT_HEARTBEAT_MS: '1.5' })).toThrow(/CANTO_AGENT_HEARTBEAT_MS/);
    expect(() => loadAgentConfig({ ...base, CANTO_AGENT_RECONNECT_MIN_MS: '500', CANTO_AGENT_RECONNECT_MAX_MS: '100' }))
      .toThrow(/must not be below/);
    expect(() => loadAgentConfig(base, { logLevel: 'loud' })).toThrow(/log level/);
  });

  it('never puts the token in an error message', () => {
    const env = { CANTO_AGENT_TOKEN: 'sekrit', CANTO_SCHEDULER_URL: 'http://x', CANTO_AGENT_RUNTIME: 'bad' };
    expect(() => loadAgentConfig(env)).toThrow(/^(?!.*sekrit)/s);
  });
});

describe('agentSocketUrl', () => {
  it('derives the websocket URL from the scheduler URL', () => {
    expect(agentSocketUrl('http://127.0.0.1:8080')).toBe('ws://127.0.0.1:8080/internal/agents/ws');
    expect(agentSocketUrl('https://canto.example.com/base/')).toBe('wss://canto.example.com/base/internal/agents/ws');
  });
});
