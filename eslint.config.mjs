import tseslint from 'typescript-eslint';
import importX, { createNodeResolver } from 'eslint-plugin-import-x';

export default tseslint.config(
  // test/fixtures/lint-cycle holds a deliberate import cycle (test/unit/lint-cycle.test.ts).
  { ignores: ['dist/**', 'sdk/dist/**', 'node_modules/**', 'eslint.config.mjs', 'test/fixtures/lint-cycle/**'] },
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    plugins: { 'import-x': importX },
    settings: {
      // Our imports name `./x.js` for `./x.ts` (NodeNext); without a resolver that knows this,
      // import-x resolves nothing and no-cycle silently checks nothing
      // (test/unit/lint-cycle.test.ts proves it fires).
      'import-x/extensions': ['.ts', '.js', '.mjs'],
      // One lint run resolves each import once: the default 30 s cache lifetime made a long run
      // resolve everything again.
      'import-x/cache': { lifetime: Infinity },
      'import-x/resolver-next': [
        createNodeResolver({ extensions: ['.ts', '.js', '.mjs', '.json'], extensionAlias: { '.js': ['.ts', '.js'] } }),
      ],
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      // npm packages never import our files, so no cycle of ours passes through them: not walking
      // their dependency trees cut the rule from about 70 s to 8 s per run.
      'import-x/no-cycle': ['error', { ignoreExternal: true }],
    },
  },
  {
    // Tests read loosely typed JSON answers; `any` there is deliberate.
    files: ['test/**/*.ts'],
    rules: { '@typescript-eslint/no-explicit-any': 'off' },
  },
  {
    files: ['shared/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', { patterns: ['**/scheduler/**', '**/agent/**', '**/cli/**'] }],
    },
  },
  {
    // The SDK is published on its own: it may import only its own files and its dependencies.
    files: ['sdk/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', { patterns: ['**/scheduler/**', '**/agent/**', '**/cli/**', '**/shared/**'] }],
    },
  },
  {
    files: ['scheduler/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: ['**/agent/**', '**/cli/**'] }] },
  },
  {
    // http routes → services → store: the servers (http/, ingress/, admin/) call services, never
    // the reverse. Wire shapes both sides need live in api/.
    files: ['scheduler/src/services/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', { patterns: ['**/agent/**', '**/cli/**', '**/http/**', '**/ingress/**', '**/admin/**'] }],
    },
  },
  {
    files: ['agent/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: ['**/scheduler/**', '**/cli/**'] }] },
  },
);
