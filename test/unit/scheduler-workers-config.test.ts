/**
 * The cluster settings (`CANTO_WORKERS`, `CANTO_AGENT_LISTEN`, `CANTO_DB_POOL_MAX`) and what each
 * worker makes of them: a replica id of its own, a share of the pool, an agent port of its own.
 */
import { availableParallelism } from 'node:os';
import { describe, expect, it } from 'vitest';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { workerConfig, workerIndexFrom } from '../../scheduler/src/cluster/worker-config.js';

const base = { DATABASE_URL: 'postgres://x/y', CANTO_SECRET_KEY: 'k', CANTO_REPLICA_ID: 'sched' };

describe('scheduler worker settings', () => {
  it('default to one worker per core, agent links over the API listener, and a pool of 20', () => {
    const config = loadSchedulerConfig(base);
    expect(config.workers).toBe(availableParallelism());
    expect(config.agentListen).toBeNull();
    expect(config.databasePoolMax).toBe(20);
  });

  it('are validated', () => {
    expect(() => loadSchedulerConfig({ ...base, CANTO_WORKERS: '0' })).toThrow(/CANTO_WORKERS/);
    expect(() => loadSchedulerConfig({ ...base, CANTO_WORKERS: 'two' })).toThrow(/CANTO_WORKERS/);
    expect(() => loadSchedulerConfig({ ...base, CANTO_AGENT_LISTEN: 'nowhere' })).toThrow(/HOST:PORT/);
    expect(() => loadSchedulerConfig({ ...base, CANTO_WORKERS: '4', CANTO_AGENT_LISTEN: '0.0.0.0:65534' })).toThrow(/65534\.\.65537/);
    // A renewal slower than half the lease loses it to one late renewal.
    expect(() => loadSchedulerConfig({ ...base, CANTO_LEASE_TTL_MS: '1000', CANTO_LEASE_RENEW_MS: '600' })).toThrow(/CANTO_LEASE_RENEW_MS \(600\) must be at most half of CANTO_LEASE_TTL_MS \(1000\)/);
    expect(loadSchedulerConfig({ ...base, CANTO_LEASE_TTL_MS: '1000', CANTO_LEASE_RENEW_MS: '500' }).leaseRenewMs).toBe(500);
  });

  it('give each worker its own replica id, pool share and agent port from the base', () => {
    const config = loadSchedulerConfig({ ...base, CANTO_WORKERS: '3', CANTO_AGENT_LISTEN: '10.0.0.5:9100', CANTO_DB_POOL_MAX: '30' });
    const workers = [1, 2, 3].map((i) => workerConfig(config, i));
    expect(workers.map((w) => w.replicaId)).toEqual(['sched-w1', 'sched-w2', 'sched-w3']);
    expect(workers.map((w) => w.agentListen)).toEqual([9100, 9101, 9102].map((port) => ({ host: '10.0.0.5', port })));
    expect(workers.map((w) => w.databasePoolMax)).toEqual([10, 10, 10]);
    // Everything else is the shared configuration.
    expect(workers[1]!.listenPort).toBe(config.listenPort);
    expect(workers[1]!.secretKey).toBe(config.secretKey);
  });

  it('give each worker a port of its own on the API host when no agent listener is set, or when its port is 0', () => {
    const onApiHost = loadSchedulerConfig({ ...base, CANTO_WORKERS: '2', CANTO_LISTEN: '0.0.0.0:8080' });
    expect(workerConfig(onApiHost, 2).agentListen).toEqual({ host: '0.0.0.0', port: 0 });
    const anyPort = loadSchedulerConfig({ ...base, CANTO_WORKERS: '2', CANTO_AGENT_LISTEN: '127.0.0.1:0' });
    expect(workerConfig(anyPort, 2).agentListen).toEqual({ host: '127.0.0.1', port: 0 });
  });

  it('leave the advertised URL to the listener agents use unless CANTO_ADVERTISE_URL names one', () => {
    expect(loadSchedulerConfig({ ...base, CANTO_LISTEN: '127.0.0.1:8080', CANTO_AGENT_LISTEN: '10.0.0.5:9100' }).advertiseUrl).toBeNull();
    expect(loadSchedulerConfig({ ...base, CANTO_ADVERTISE_URL: 'https://sched-a.example:8443/' }).advertiseUrl).toBe('https://sched-a.example:8443');
  });

  it('keep a few connections per worker however small the pool', () => {
    const config = loadSchedulerConfig({ ...base, CANTO_WORKERS: '8', CANTO_DB_POOL_MAX: '4' });
    expect(workerConfig(config, 8).databasePoolMax).toBe(2);
  });

  it('refuse an index outside the worker count, and read it from the environment', () => {
    const config = loadSchedulerConfig({ ...base, CANTO_WORKERS: '2' });
    expect(() => workerConfig(config, 0)).toThrow(/1\.\.2/);
    expect(() => workerConfig(config, 3)).toThrow(/1\.\.2/);
    expect(workerIndexFrom({})).toBeNull();
    expect(workerIndexFrom({ CANTO_WORKER_INDEX: '2' })).toBe(2);
    expect(() => workerIndexFrom({ CANTO_WORKER_INDEX: 'x' })).toThrow(/CANTO_WORKER_INDEX/);
  });
});
