/**
 * The SDK's generated types match what a real scheduler serves. The documents come from a
 * running scheduler (not from the generator's database-less app), are rendered with
 * openapi-typescript exactly as `npm run sdk:generate` renders them, and compared with the
 * committed files: a route or schema changed without regenerating fails here, and so would a
 * generator that drifted from the served documents.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GENERATED, REGENERATE_COMMAND, renderTypes } from '../../scripts/sdk-codegen.js';
import { startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';

const root = join(import.meta.dirname, '..', '..');
let s: TestScheduler;

beforeAll(async () => {
  s = await startTestScheduler();
});

afterAll(async () => {
  await s?.close();
});

describe('generated SDK types', () => {
  for (const { file, document } of GENERATED) {
    it(`${file} is what ${document} generates`, async () => {
      const res = await fetch(s.url + document);
      expect(res.status).toBe(200);
      const fresh = await renderTypes((await res.json()) as Parameters<typeof renderTypes>[0], document);
      const committed = readFileSync(join(root, file), 'utf8');
      if (fresh !== committed) {
        const a = committed.split('\n');
        const b = fresh.split('\n');
        const line = a.findIndex((text, i) => text !== b[i]);
        expect.fail(
          `${file} is stale: the served ${document} differs from it (first at line ${line + 1}: ` +
            `committed ${JSON.stringify(a[line] ?? '')}, served ${JSON.stringify(b[line] ?? '')}). Run ${REGENERATE_COMMAND} and commit the result.`,
        );
      }
    });
  }
});
