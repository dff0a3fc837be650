/** A fresh, migrated database per test file, cloned from the run's template. */
import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { connectDatabase } from '../../scheduler/src/store/db.js';

export async function freshDatabaseUrl(): Promise<string> {
  const template = inject('pgUrl');
  const name = `t_${randomBytes(6).toString('hex')}`;
  const admin = connectDatabase(template.replace('/canto_template?', '/postgres?'), { max: 1 });
  try {
    await admin.unsafe(`CREATE DATABASE ${name} TEMPLATE canto_template`);
  } finally {
    await admin.end();
  }
  return template.replace('/canto_template?', `/${name}?`);
}
