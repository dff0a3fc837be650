/**
 * The TypeScript examples of README.md and sdk/README.md compile against the SDK as it is: each
 * ```ts block is typechecked as a module of its own beside the repository's package.json (so it
 * is ESM, with top-level await), `@canto/sdk` resolving to sdk/src. An SDK change that breaks an
 * example fails here rather than in a reader's editor.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..', '..');

function tsBlocks(file: string): string[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  return [...text.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => m[1]!);
}

describe('TypeScript examples in the READMEs', () => {
  it('typecheck against the SDK', () => {
    const snippets = new Map<string, string>();
    for (const file of ['README.md', 'sdk/README.md']) {
      tsBlocks(file).forEach((code, i) => snippets.set(join(ROOT, `${file.replace(/\W/g, '-')}-example-${i + 1}.ts`), code));
    }
    expect(snippets.size).toBeGreaterThanOrEqual(2);
    const options: ts.CompilerOptions = {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      lib: ['lib.es2023.d.ts'],
      types: ['node'],
      strict: true,
      noEmit: true,
      skipLibCheck: true,
      baseUrl: ROOT,
      paths: { '@canto/sdk': ['sdk/src/index.ts'] },
    };
    const host = ts.createCompilerHost(options);
    const { getSourceFile, fileExists, readFile } = host;
    host.fileExists = (name) => snippets.has(name) || fileExists.call(host, name);
    host.readFile = (name) => snippets.get(name) ?? readFile.call(host, name);
    host.getSourceFile = (name, version, ...rest) =>
      snippets.has(name) ? ts.createSourceFile(name, snippets.get(name)!, version) : getSourceFile.call(host, name, version, ...rest);
    const program = ts.createProgram([...snippets.keys()], options, host);
    const problems = ts
      .getPreEmitDiagnostics(program)
      .filter((d) => d.file && snippets.has(d.file.fileName))
      .map((d) => `${d.file!.fileName.slice(ROOT.length + 1)}:${d.file!.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`);
    expect(problems).toEqual([]);
  });
});
