/**
 * `canto vnc <stream-url>`: lets any VNC viewer use a stream ticket. A ticket URL
 * (`tcp://host:port/?ticket=…`, from `POST /v1/desktops/{id}/stream`) needs one line sent before
 * RFB starts, which ordinary viewers cannot send. The bridge listens on a local port; the first
 * viewer to connect is relayed to the stream gateway after the bridge has presented the ticket.
 * Tickets work once, so the bridge serves one connection and exits when it ends.
 */
import { connect, createServer, type Socket } from 'node:net';

export interface StreamTarget {
  readonly host: string;
  readonly port: number;
  readonly ticket: string;
}

/** Parses a stream URL; throws a message naming what is wrong. */
export function parseStreamUrl(value: string): StreamTarget {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new Error(`not a URL: ${value}`);
  }
  const ticket = url.searchParams.get('ticket');
  if (url.protocol !== 'tcp:' || !url.hostname || !url.port || !ticket) {
    throw new Error('expected tcp://host:port/?ticket=…, as POST /v1/desktops/{id}/stream returns');
  }
  return { host: url.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(url.port), ticket };
}

/**
 * Dials the gateway and presents the ticket. Resolves with the socket once the gateway has
 * answered with RFB (the bytes already read are handed back); rejects with the gateway's reason.
 */
export function dialStream(target: StreamTarget, timeoutMs = 10_000): Promise<{ socket: Socket; head: Buffer }> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: target.host, port: target.port });
    let head = Buffer.alloc(0);
    const fail = (err: Error) => {
      socket.destroy();
      reject(err);
    };
    socket.setTimeout(timeoutMs, () => fail(new Error('the stream gateway did not answer')));
    socket.once('error', fail);
    socket.once('connect', () => socket.write(`${target.ticket}\n`));
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      if (head.length < 4) return;
      socket.off('data', onData);
      socket.setTimeout(0);
      socket.off('error', fail);
      if (head.subarray(0, 4).toString('latin1') === 'ERR ') {
        fail(new Error(`the stream gateway refused the ticket: ${head.toString('latin1').slice(4).trim()}`));
        return;
      }
      socket.pause();
      resolve({ socket, head });
    };
    socket.on('data', onData);
    socket.once('end', () => fail(new Error('the stream gateway closed the connection')));
  });
}

export interface BridgeOptions {
  readonly listenHost: string;
  readonly listenPort: number;
  readonly onListening?: (port: number) => void;
}

/** Serves one viewer, relaying it to the stream; resolves when that connection has ended. */
export function bridgeOnce(target: StreamTarget, options: BridgeOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    const server = createServer({ pauseOnConnect: true }, (viewer) => {
      server.close(); // one ticket, one viewer
      dialStream(target).then(
        ({ socket, head }) => {
          viewer.write(head);
          viewer.pipe(socket);
          socket.pipe(viewer);
          viewer.resume();
          socket.resume();
          const done = () => {
            viewer.destroy();
            socket.destroy();
            resolve();
          };
          viewer.once('close', done);
          socket.once('close', done);
          viewer.on('error', () => undefined);
          socket.on('error', () => undefined);
        },
        (err: Error) => {
          viewer.destroy();
          reject(err);
        },
      );
    });
    server.once('error', reject);
    server.listen(options.listenPort, options.listenHost, () => {
      options.onListening?.((server.address() as { port: number }).port);
    });
  });
}
