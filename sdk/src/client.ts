/**
 * `createCanto`: the typed `/v1` client (every route of the served OpenAPI document, through
 * openapi-fetch as `canto.api`) plus the helpers every client ends up writing: lifecycle calls
 * that carry an Idempotency-Key and can wait for their operation, exec, and files.
 *
 * Every lifecycle call and every create sends an Idempotency-Key (the caller's, or a fresh
 * random one), so that the SDK's own retry after a 503 or a dropped connection can never create
 * a second desktop or enqueue a second operation: the server answers a repeated key with the
 * first result (docs/api.md §4.11). A caller that retries on its own should pass its own key.
 */
import type { Client } from 'openapi-fetch';
import type { components, paths } from './generated/api.js';
import { Files } from './files.js';
import { pollOperation, type Operation, type WaitOptions } from './operations.js';
import { createTransport, type TransportOptions } from './transport.js';

export type Desktop = components['schemas']['DesktopJson'];
export type DesktopState = Desktop['state'];
export type ExecResult = components['schemas']['ExecResponse'];
export type ProcessStatus = components['schemas']['ProcessStatusResponse'];
export type CreateDesktopBody = paths['/v1/desktops']['post']['requestBody']['content']['application/json'];
export type ForkBody = paths['/v1/desktops/{id}/fork']['post']['requestBody']['content']['application/json'];

export interface CantoOptions extends Omit<TransportOptions, 'token'> {
  /** An API key (`svc_sk_…`) or an access token. */
  apiKey: string;
}

export interface CallOptions {
  /**
   * Sent as `Idempotency-Key`; default a fresh random key per call. When the call fails, the error
   * carries the key it was sent with (`err.idempotencyKey`): retrying with it answers what the
   * first attempt made, if it made anything, instead of making a second one.
   */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

export interface LifecycleOptions extends CallOptions {
  /** Fence on the desktop's generation (docs/api.md §3.4): the operation fails if it moved on. */
  expectedGeneration?: number;
  /** Resolve only once the operation settles (polling); `true` or how to wait. */
  wait?: boolean | WaitOptions;
}

const newKey = () => globalThis.crypto.randomUUID();

/** Runs a keyed call; an error it throws names the key, for the caller's own retry. */
async function keyed<T>(key: string, call: (key: string) => Promise<T>): Promise<T> {
  try {
    return await call(key);
  } catch (err) {
    if (err instanceof Error) Object.assign(err, { idempotencyKey: key });
    throw err;
  }
}

export class Canto {
  /** The typed client for every `/v1` route; answers of 400 and up are thrown as `CantoProblem`. */
  readonly api: Client<paths>;
  readonly files: Files;

  constructor(options: CantoOptions) {
    const { apiKey, ...transport } = options;
    this.api = createTransport<paths>({ ...transport, token: apiKey });
    this.files = new Files(this.api);
  }

  // Desktops.

  async listDesktops(state?: DesktopState, signal?: AbortSignal): Promise<Desktop[]> {
    const { data } = await this.api.GET('/v1/desktops', { params: { query: state ? { state } : {} }, signal });
    return data!.desktops;
  }

  async getDesktop(id: string, signal?: AbortSignal): Promise<Desktop> {
    const { data } = await this.api.GET('/v1/desktops/{id}', { params: { path: { id } }, signal });
    return data!;
  }

  /** Creates a desktop; repeating the same `idempotencyKey` answers the desktop it created. */
  async createDesktop(body: CreateDesktopBody, options: CallOptions = {}): Promise<Desktop> {
    return keyed(options.idempotencyKey ?? newKey(), async (key) => {
      const { data } = await this.api.POST('/v1/desktops', { params: { header: { 'idempotency-key': key } }, body, signal: options.signal });
      return data!;
    });
  }

  async updateDesktop(id: string, body: { idle_timeout_secs?: number }, signal?: AbortSignal): Promise<Desktop> {
    const { data } = await this.api.PATCH('/v1/desktops/{id}', { params: { path: { id } }, body, signal });
    return data!;
  }

  wake(id: string, options: LifecycleOptions = {}): Promise<Operation> {
    return this.lifecycle('wake', id, options);
  }

  hibernate(id: string, options: LifecycleOptions = {}): Promise<Operation> {
    return this.lifecycle('hibernate', id, options);
  }

  destroy(id: string, options: LifecycleOptions = {}): Promise<Operation> {
    return this.lifecycle('destroy', id, options);
  }

  /** Forks a hibernated desktop; on success `result.desktop_ids` names the copies. */
  async fork(id: string, body: ForkBody, options: Omit<LifecycleOptions, 'expectedGeneration'> = {}): Promise<Operation> {
    const data = await keyed(options.idempotencyKey ?? newKey(), async (key) => {
      const answer = await this.api.POST('/v1/desktops/{id}/fork', { params: { path: { id }, header: { 'idempotency-key': key } }, body, signal: options.signal });
      return answer.data!;
    });
    return this.settle(data, options);
  }

  private async lifecycle(action: 'wake' | 'hibernate' | 'destroy', id: string, options: LifecycleOptions): Promise<Operation> {
    const data = await keyed(options.idempotencyKey ?? newKey(), async (key) => {
      const init = {
        params: { path: { id }, header: { 'idempotency-key': key } },
        body: options.expectedGeneration === undefined ? {} : { expected_generation: options.expectedGeneration },
        signal: options.signal,
      };
      // Three routes with one shape; the switch keeps each call typed by its own path.
      const answer =
        action === 'wake'
          ? await this.api.POST('/v1/desktops/{id}/wake', init)
          : action === 'hibernate'
            ? await this.api.POST('/v1/desktops/{id}/hibernate', init)
            : await this.api.POST('/v1/desktops/{id}/destroy', init);
      return answer.data!;
    });
    return this.settle(data, options);
  }

  private settle(op: Operation, options: LifecycleOptions): Promise<Operation> {
    if (!options.wait) return Promise.resolve(op);
    return this.waitForOperation(op, { signal: options.signal, ...(options.wait === true ? {} : options.wait) });
  }

  // Operations.

  async getOperation(id: string, signal?: AbortSignal): Promise<Operation> {
    const { data } = await this.api.GET('/v1/operations/{id}', { params: { path: { id } }, signal });
    return data!;
  }

  /**
   * Polls until the operation settles. Resolves with it when it succeeded; throws
   * `OperationFailedError` when it failed (unless `allowFailure`) and `OperationTimeoutError`
   * when `timeoutMs` passed first.
   */
  waitForOperation(op: Operation | string, options: WaitOptions = {}): Promise<Operation> {
    const first: Operation = typeof op === 'string' ? ({ id: op, state: 'pending' } as Operation) : op;
    return pollOperation(first, (opId, signal) => this.getOperation(opId, signal), options);
  }

  // Guest commands.

  /** Runs `command` in the desktop and waits for it (at most `timeoutSecs`, default 60, cap 300). */
  async exec(id: string, command: string, options: { timeoutSecs?: number; signal?: AbortSignal } = {}): Promise<ExecResult> {
    const { data } = await this.api.POST('/v1/desktops/{id}/exec', {
      params: { path: { id } },
      body: { command, ...(options.timeoutSecs === undefined ? {} : { timeout_secs: options.timeoutSecs }) },
      signal: options.signal,
    });
    return data as ExecResult;
  }

  /** Starts `command` detached; `process()` reads its status and output later. */
  async execDetached(id: string, command: string, signal?: AbortSignal): Promise<string> {
    const { data } = await this.api.POST('/v1/desktops/{id}/exec', { params: { path: { id } }, body: { command, detached: true }, signal });
    return (data as { process_id: string }).process_id;
  }

  async process(id: string, processId: string, options: { tailBytes?: number; signal?: AbortSignal } = {}): Promise<ProcessStatus> {
    const { data } = await this.api.GET('/v1/desktops/{id}/processes/{process_id}', {
      params: { path: { id, process_id: processId }, query: options.tailBytes === undefined ? {} : { tail_bytes: String(options.tailBytes) } },
      signal: options.signal,
    });
    return data!;
  }
}

/** A client of the `/v1` API at `baseUrl`, authenticated by `apiKey`. */
export function createCanto(options: CantoOptions): Canto {
  return new Canto(options);
}
