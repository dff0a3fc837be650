/**
 * `npm run sdk:generate`: rewrites the SDK's generated types (sdk/src/generated/) from the
 * OpenAPI documents the scheduler serves. Run it after changing any route or schema; the drift
 * test says so when it was forgotten.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { buildDocuments, GENERATED, renderTypes } from './sdk-codegen.js';

const root = join(import.meta.dirname, '..');
const documents = await buildDocuments();
for (const { file, document } of GENERATED) {
  writeFileSync(join(root, file), await renderTypes(documents[document]!, document));
  process.stdout.write(`wrote ${file}\n`);
}
