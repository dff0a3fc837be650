import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';

export default tseslint.config(
  { ignores: ['dist/**', 'sdk/dist/**', 'node_modules/**', 'eslint.config.mjs'] },
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    plugins: { 'import-x': importX },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'import-x/no-cycle': 'error',
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
    files: ['agent/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: ['**/scheduler/**', '**/cli/**'] }] },
  },
);
