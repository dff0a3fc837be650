/**
 * The port gateway's choice between handing a link to a relay of its own (RuntimeDriver.
 * handOffGuestPort) and relaying it itself, over real sockets with fakes for both: a verified link
 * goes to `handOff` (which answers it, as a relay does) and `open` is not asked; a driver without
 * relays (`null`) falls back to `open`; a refusal before the handoff is the gateway's `ERR`; a
 * client that sent bytes before `OK` is relayed by the gateway, which holds them; and a relay's
 * outcome is logged.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { portLinkLine, type PortTarget } from '../../shared/src/port-link.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import { PortGateway, type PortGatewayOptions } from '../../agent/src/ports/gateway.js';
import type { HandedOffLink, RelayOutcome } from '../../agent/src/runtime/driver.js';
import { until } from '../helpers/wait.js';

const SECRET = 'test-join-token-0123456789abcdef';

/** Connects, writes `first`, and answers everything received until the gateway closes. */
async function exchange(port: number, first: string): Promise<string> {
  const socket = connect({ host: '127.0.0.1', port });
  const parts: Buffer[] = [];
  socket.on('data', (c: Buffer) => parts.push(c));
  socket.on('error', () => undefined);
  socket.write(first);
  await new Promise((resolve) => socket.once('close', resolve));
  return Buffer.concat(parts).toString('latin1');
}

describe('port gateway handing links to relays', () => {
  let gateway: PortGateway | null = null;
  let echo: Server | null = null;
  const logs: Array<{ msg: string; fields?: Record<string, unknown> }> = [];
  const target: PortTarget = { desktopId: newId('desktop'), generation: 3, port: 8080 };
  const line = () => portLinkLine(SECRET, target);

  async function start(options: Pick<PortGatewayOptions, 'handOff'> & Partial<PortGatewayOptions>): Promise<PortGateway> {
    gateway = await PortGateway.start({
      listenHost: '127.0.0.1',
      port: 0,
      open: () => Promise.reject(new Error('open must not be asked')),
      log: (msg, fields) => logs.push({ msg, fields: fields as Record<string, unknown> }),
      ...options,
    });
    gateway.setKey(SECRET);
    return gateway;
  }

  afterEach(async () => {
    await gateway?.close();
    gateway = null;
    echo?.close();
    echo = null;
    logs.length = 0;
  });

  it('hands a verified link over and lets the relay answer it; its outcome is logged', async () => {
    const handed: PortTarget[] = [];
    let finish!: (outcome: RelayOutcome) => void;
    const g = await start({
      handOff: async (t, client): Promise<HandedOffLink> => {
        handed.push(t);
        // What a relay does with the connection it was given.
        client.end('OK\nfrom the relay');
        return { outcome: new Promise((resolve) => (finish = resolve)) };
      },
    });
    expect(await exchange(g.port, line())).toBe('OK\nfrom the relay');
    expect(handed).toEqual([target]);
    expect(logs.map((l) => l.msg)).toContain('port connection handed off');
    expect(g.stats()).toEqual({ relayed: 1, relayedOpen: 1, agent: 0, agentOpen: 0 });
    finish('refused');
    await until(() => logs.some((l) => l.msg === 'port connection refused' && l.fields?.code === 'refused'), 2_000, 'the outcome in the log');
    expect(g.stats()).toEqual({ relayed: 1, relayedOpen: 0, agent: 0, agentOpen: 0 });
  });

  it('relays the link itself when the driver has no relays', async () => {
    echo = createServer((s) => s.pipe(s));
    await new Promise<void>((resolve) => echo!.listen(0, '127.0.0.1', resolve));
    const echoPort = (echo.address() as { port: number }).port;
    const g = await start({
      handOff: async () => null,
      open: () => new Promise<Socket>((resolve) => {
        const s = connect({ host: '127.0.0.1', port: echoPort, allowHalfOpen: true }, () => resolve(s));
      }),
    });
    const socket = connect({ host: '127.0.0.1', port: g.port });
    const got: Buffer[] = [];
    socket.on('data', (c: Buffer) => got.push(c));
    socket.write(line());
    await until(() => Buffer.concat(got).toString() === 'OK\n', 2_000, 'OK');
    expect(g.stats()).toEqual({ relayed: 0, relayedOpen: 0, agent: 1, agentOpen: 1 });
    socket.end('ping');
    await new Promise((resolve) => socket.once('close', resolve));
    expect(Buffer.concat(got).toString()).toBe('OK\nping');
    await until(() => g.stats().agentOpen === 0, 2_000, 'the link to close');
  });

  it("answers a refusal before the handoff with the gateway's own ERR line", async () => {
    const g = await start({ handOff: () => Promise.reject(new AgentFailure('not_running', 'stopping', false)) });
    expect(await exchange(g.port, line())).toBe('ERR not_running\n');
    const h = await start({ handOff: () => Promise.reject(new Error('the relay did not start')) });
    expect(await exchange(h.port, line())).toBe('ERR unavailable\n');
  });

  it('keeps a link whose client sent bytes before OK: it holds them and relays them itself', async () => {
    const handOffs: PortTarget[] = [];
    const g = await start({
      handOff: async (t) => {
        handOffs.push(t);
        return null;
      },
      open: async () => {
        const server = createServer((s) => s.pipe(s));
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
        echo = server;
        return new Promise<Socket>((resolve) => {
          const s = connect({ host: '127.0.0.1', port: (server.address() as { port: number }).port, allowHalfOpen: true }, () => resolve(s));
        });
      },
    });
    const socket = connect({ host: '127.0.0.1', port: g.port });
    const got: Buffer[] = [];
    socket.on('data', (c: Buffer) => got.push(c));
    socket.write(`${line()}early`);
    await until(() => Buffer.concat(got).toString() === 'OK\nearly', 2_000, 'the early bytes echoed');
    socket.destroy();
    expect(handOffs).toEqual([]);
  });
});
