/**
 * The import-cycle rule really fires: linting a fixture pair that imports each other, with the
 * repository's own eslint config, reports the cycle in both files. Without a resolver for our
 * `./x.js` → `x.ts` imports, import-x/no-cycle resolves nothing and passes everything; this
 * test fails if that ever happens again. The fixtures are outside the normal lint run.
 */
import { join } from 'node:path';
import { ESLint } from 'eslint';
import { describe, expect, it } from 'vitest';

const root = join(import.meta.dirname, '..', '..');
const fixtures = join(root, 'test', 'fixtures', 'lint-cycle');

describe('import-x/no-cycle', () => {
  it('reports a cycle in each file of it, and nothing in a file that only imports it', async () => {
    const eslint = new ESLint({ cwd: root, ignore: false });
    const results = await eslint.lintFiles(['a.ts', 'b.ts', 'c.ts'].map((f) => join(fixtures, f)));
    const cycles = Object.fromEntries(
      results.map((r) => [r.filePath.slice(fixtures.length + 1), r.messages.filter((m) => m.ruleId === 'import-x/no-cycle').length]),
    );
    expect(cycles).toEqual({ 'a.ts': 1, 'b.ts': 1, 'c.ts': 0 });
    // Nothing else is wrong with the fixtures: the cycle is what fails them.
    expect(results.flatMap((r) => r.messages.filter((m) => m.ruleId !== 'import-x/no-cycle'))).toEqual([]);
  }, 120_000);

  it('is skipped by the normal lint run', async () => {
    expect(await new ESLint({ cwd: root }).isPathIgnored(join(fixtures, 'a.ts'))).toBe(true);
  });
});
