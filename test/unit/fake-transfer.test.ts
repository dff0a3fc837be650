import { existsSync } from 'node:fs';
import { dirname } from 'node:path';
import { expect, it } from 'vitest';
import { FakeDriver } from '../../agent/src/runtime/fake.js';

it('a closed fake runtime neither keeps nor makes again its temporary staging directory', async () => {
  const driver = new FakeDriver();
  const staging = driver.transfer.stagingDir('dsk_one');
  const root = dirname(staging);
  expect(existsSync(root)).toBe(true);
  await driver.close();
  expect(existsSync(root)).toBe(false);
  // An import still in flight when its agent stopped fails, instead of leaving a directory behind.
  expect(() => driver.transfer.stagingDir('dsk_one')).toThrow('the runtime is closed');
  expect(existsSync(root)).toBe(false);
});

it('a fake runtime closed before it staged anything makes no staging directory afterwards', async () => {
  const driver = new FakeDriver();
  await driver.close();
  // An import that reached the runtime only after its agent stopped (a full run left such a directory behind).
  expect(() => driver.transfer.stagingDir('dsk_one')).toThrow('the runtime is closed');
});
