/**
 * The SDK's operation waits and per-attempt time limits, on a fetch of the test's own (the
 * client's `fetch` option): a wait polls until the operation settles and returns it, throws the
 * failed operation or, past its deadline, the operation as last seen; the caller's abort ends
 * it as an abort; an attempt that outlives `timeoutMs` is a connection error, retried when safe.
 */
import { describe, expect, it } from 'vitest';
import { CantoConnectionError, OperationFailedError, OperationTimeoutError, createCanto, type Operation } from '../../sdk/src/index.js';

const op = (state: Operation['state'], extra: Partial<Operation> = {}): Operation => ({
  id: 'op_0000000000000000000000aa',
  desktop_id: 'dsk_0000000000000000000000aa',
  kind: 'wake',
  state,
  result: null,
  error: null,
  created_at: new Date().toISOString(),
  settled_at: null,
  ...extra,
});

/** A client whose every GET of the operation answers the next of `states` (the last one repeats). */
function polling(states: Operation[]) {
  const requests: Request[] = [];
  const canto = createCanto({
    baseUrl: 'http://canto.test',
    apiKey: 'svc_sk_test',
    fetch: async (request) => {
      requests.push(request);
      const next = states.length > 1 ? states.shift()! : states[0]!;
      return new Response(JSON.stringify(next), { status: 200, headers: { 'content-type': 'application/json' } });
    },
  });
  return { canto, requests };
}

describe('waitForOperation', () => {
  it('polls until the operation settles and returns it', async () => {
    const { canto, requests } = polling([op('running'), op('running'), op('succeeded', { result: { restored: true } })]);
    const settled = await canto.waitForOperation(op('pending'), { intervalMs: 1 });
    expect(settled).toMatchObject({ state: 'succeeded', result: { restored: true } });
    expect(requests.length).toBe(3);
    expect(new URL(requests[0]!.url).pathname).toBe('/v1/operations/op_0000000000000000000000aa');
    expect(requests[0]!.headers.get('authorization')).toBe('Bearer svc_sk_test');
  });

  it('throws a failed operation, or returns it when failure is allowed', async () => {
    const failed = op('failed', { error: { code: 'host_unavailable', message: 'the desktop host is unreachable' } });
    const err = await polling([failed]).canto.waitForOperation('op_0000000000000000000000aa', { intervalMs: 1 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OperationFailedError);
    expect((err as OperationFailedError).operation).toEqual(failed);
    expect((err as Error).message).toBe('operation op_0000000000000000000000aa failed: the desktop host is unreachable (host_unavailable)');
    expect(await polling([failed]).canto.waitForOperation(op('running'), { intervalMs: 1, allowFailure: true })).toEqual(failed);
  });

  it('gives up at timeoutMs with the operation as last seen', async () => {
    const err = await polling([op('running')]).canto.waitForOperation(op('pending'), { intervalMs: 5, maxIntervalMs: 5, timeoutMs: 100 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OperationTimeoutError);
    expect((err as OperationTimeoutError).operation.state).toBe('running');
  });

  it("ends with the caller's abort, not as a timeout", async () => {
    const controller = new AbortController();
    const waiting = polling([op('running')]).canto.waitForOperation(op('pending'), { intervalMs: 5, signal: controller.signal });
    controller.abort(new Error('stop waiting'));
    await expect(waiting).rejects.toThrow('stop waiting');
  });

  it('waits for the lifecycle call it was asked to wait for', async () => {
    const requests: string[] = [];
    const states = [op('pending'), op('succeeded')];
    const canto = createCanto({
      baseUrl: 'http://canto.test/',
      apiKey: 'k',
      fetch: async (request) => {
        requests.push(`${request.method} ${new URL(request.url).pathname} ${request.headers.get('idempotency-key') ? 'keyed' : ''}`.trim());
        return Response.json(states.shift(), { status: request.method === 'POST' ? 202 : 200 });
      },
    });
    expect((await canto.hibernate('dsk_0000000000000000000000aa', { wait: { intervalMs: 1 } })).state).toBe('succeeded');
    expect(requests).toEqual(['POST /v1/desktops/dsk_0000000000000000000000aa/hibernate keyed', 'GET /v1/operations/op_0000000000000000000000aa']);
  });
});

describe('timeoutMs', () => {
  it('ends an attempt that takes too long as a connection error, after retrying a safe request', async () => {
    let attempts = 0;
    const canto = createCanto({
      baseUrl: 'http://canto.test',
      apiKey: 'k',
      timeoutMs: 50,
      retry: { maxAttempts: 2, sleep: async () => undefined },
      // Answers only when the request is aborted, as a server that never answers would.
      fetch: (request) => {
        attempts++;
        return new Promise((_resolve, reject) => request.signal.addEventListener('abort', () => reject(request.signal.reason)));
      },
    });
    const err = await canto.listDesktops().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CantoConnectionError);
    expect((err as CantoConnectionError).code).toBe('TimeoutError');
    expect(attempts).toBe(2);
  });
});
