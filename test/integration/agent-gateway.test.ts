/**
 * The scheduler's end of the agent link, driven by a hand-made agent speaking the protocol over
 * a real websocket: protocol-version refusal, silent links dropped once the host is silent for
 * CANTO_HOST_DOWN_MS (the host then reads `down`), a newer link of the same host replacing an older
 * one, and the hello fence: a 1.7 agent's host reads ready only once it says `host.ready`. A
 * stopping replica closes the sockets still in their hello, so its stop does not wait on them.
 */
import { PROTOCOL_VERSION } from '../../shared/src/protocol.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { RpcPeer } from '../../shared/src/rpc.js';
import { newId } from '../../shared/src/ids.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { JOIN_TOKEN, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { failure } from '../helpers/agent-failure.js';

function hello(hostId: string, protocol = '1.0') {
  return {
    protocol,
    host_id: hostId,
    agent_instance_id: newId('host'),
    hostname: 'test-host',
    capabilities: { runtime: 'hand-made', memory_snapshots: false },
    capacity: { vcpus: 2, memory_mb: 4096 },
    desktops: [],
  };
}

async function dial(s: TestScheduler): Promise<{ ws: WebSocket; peer: RpcPeer; closed: Promise<number> }> {
  const ws = new WebSocket(`${s.url.replace(/^http/, 'ws')}/internal/agents/ws`, { headers: { authorization: `Bearer ${JOIN_TOKEN}` } });
  await new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject));
  const closed = new Promise<number>((resolve) => ws.once('close', (code) => resolve(code)));
  return { ws, peer: new RpcPeer(ws), closed };
}

describe('agent gateway', () => {
  let s: TestScheduler;
  let sql: Sql;

  beforeAll(async () => {
    s = await startTestScheduler({ CANTO_HEARTBEAT_MS: '50' });
    sql = connectDatabase(s.databaseUrl, { max: 1 });
    await until(() => s.leadership.isLeader(), 5_000, 'leadership');
  });

  afterAll(async () => {
    await sql.end();
    await s.close();
  });

  it('refuses an agent speaking a newer protocol major', async () => {
    const { peer, closed } = await dial(s);
    const err = await failure(peer.request('hello', hello(newId('host'), '2.0'), 2_000));
    expect(err.code).toBe('unsupported');
    expect(await closed).toBe(1002);
  });

  it('answers hello with the heartbeat interval and closes a link that stops heartbeating', async () => {
    const hostId = newId('host');
    const { peer, closed } = await dial(s);
    const reply = (await peer.request('hello', hello(hostId), 2_000)) as { heartbeat_ms: number };
    expect(reply.heartbeat_ms).toBe(50);
    const beat = setInterval(() => peer.notify('heartbeat', { running_desktops: 0 }), 40);
    await until(async () => (await sql`SELECT status FROM hosts WHERE id = ${hostId}`)[0]?.status === 'ready', 2_000, 'host ready').finally(() => clearInterval(beat));
    expect(s.agents.isConnected(hostId)).toBe(true);
    // Heartbeats for a while keep the link open well past the silence limit (2.25 intervals)…
    for (let i = 0; i < 10; i++) {
      peer.notify('heartbeat', { running_desktops: 0 });
      await new Promise((r) => setTimeout(r, 40));
    }
    expect(s.agents.isConnected(hostId)).toBe(true);
    // …and silence drops it, without a closing handshake (the other end is not answering).
    expect(await closed).toBe(1006);
    await until(async () => (await sql`SELECT status FROM hosts WHERE id = ${hostId}`)[0]?.status === 'down', 2_000, 'host down');
    expect(s.agents.isConnected(hostId)).toBe(false);
  });

  it('replaces an older link of the same host with the newer one', async () => {
    const hostId = newId('host');
    const first = await dial(s);
    await first.peer.request('hello', hello(hostId), 2_000);
    const second = await dial(s);
    await second.peer.request('hello', hello(hostId), 2_000);
    expect(await first.closed).toBe(1000);
    second.peer.notify('heartbeat', { running_desktops: 0 });
    expect(s.agents.isConnected(hostId)).toBe(true);
    // The host stays ready: the old link closing must not mark it down.
    const [row] = await sql`SELECT status FROM hosts WHERE id = ${hostId}`;
    expect(row!.status).toBe('ready');
    second.ws.close();
    await second.closed;
  });

  it('answers a 1.7 hello with the replicas, the epoch and the fence, and reads the host ready only after host.ready', async () => {
    const hostId = newId('host');
    const { peer, ws, closed } = await dial(s);
    const reply = (await peer.request('hello', hello(hostId, '1.7'), 2_000)) as Record<string, unknown>;
    // The scheduler answers with its own version, whatever older minor the agent speaks.
    expect(reply).toMatchObject({ protocol: PROTOCOL_VERSION, replica_id: expect.any(String), fence: [] });
    expect(reply.replicas).toEqual([{ id: reply.replica_id, url: expect.stringMatching(/^http:\/\//) }]);
    expect(reply.leader_epoch).toBe(s.leadership.term()!.epoch);
    peer.notify('heartbeat', { running_desktops: 0 });
    await new Promise((r) => setTimeout(r, 30));
    expect((await sql`SELECT status FROM hosts WHERE id = ${hostId}`)[0]!.status).toBe('down');
    peer.notify('host.ready', { stopped: 0 });
    await until(async () => (await sql`SELECT status FROM hosts WHERE id = ${hostId}`)[0]?.status === 'ready', 2_000, 'host ready');
    ws.close();
    await closed;
  });
});

describe('a stopping replica', () => {
  it('closes agent sockets still in their hello, and its stop does not wait for them', async () => {
    const s = await startTestScheduler();
    // Dialled, never a hello: as an agent told of a replica that is stopping already.
    const pending = await dial(s);
    const stopping = performance.now();
    await s.close();
    // Well within the stop budget; before, the stop waited for the hello's own timeout.
    expect(performance.now() - stopping).toBeLessThan(5_000);
    expect(await pending.closed).toBe(1001);
  });
});
