/** Awaits a promise that must reject with an `AgentFailure`, and returns that failure. */
import { expect } from 'vitest';
import { AgentFailure } from '../../shared/src/protocol.js';

export async function failure(promise: Promise<unknown>): Promise<AgentFailure> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AgentFailure);
  return err as AgentFailure;
}
