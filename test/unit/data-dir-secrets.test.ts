/**
 * `canto up`'s secrets.json: a new data directory gets an admin token with the other secrets
 * (mode 0600), one made before the admin token existed gets one added and keeps the rest, and the
 * CLI reads it back, with errors that name the file and never its content.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadOrCreateSecrets, readAdminToken, recordApiUrl, recordedApiUrl } from '../../cli/src/data-dir.js';

const root = mkdtempSync(join(tmpdir(), 'canto-secrets-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('data directory secrets', () => {
  it('creates every secret, the admin token included, readable by the owner only', () => {
    const dir = join(root, 'new');
    const secrets = loadOrCreateSecrets(dir);
    expect(secrets.admin_token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(statSync(join(dir, 'secrets.json')).mode & 0o777).toBe(0o600);
    expect(loadOrCreateSecrets(dir)).toEqual(secrets);
    expect(readAdminToken(dir)).toBe(secrets.admin_token);
  });

  it('adds an admin token to an older secrets.json and keeps the rest', () => {
    const dir = join(root, 'old');
    loadOrCreateSecrets(dir);
    const path = join(dir, 'secrets.json');
    writeFileSync(path, JSON.stringify({ secret_key: 'kept-key', join_token: 'kept-token' }), { mode: 0o644 });
    const upgraded = loadOrCreateSecrets(dir);
    expect(upgraded).toMatchObject({ secret_key: 'kept-key', join_token: 'kept-token', admin_token: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/) });
    expect(JSON.parse(readFileSync(path, 'utf8'))).toEqual(upgraded);
    expect(statSync(path).mode & 0o777).toBe(0o600);
  });

  it('names the file when it has no admin token or cannot be read', () => {
    const dir = join(root, 'bare');
    loadOrCreateSecrets(dir);
    writeFileSync(join(dir, 'secrets.json'), JSON.stringify({ secret_key: 'secret-value', join_token: 'x' }));
    expect(() => readAdminToken(dir)).toThrow(`${join(dir, 'secrets.json')} has no admin token yet`);
    expect(() => readAdminToken(join(root, 'missing'))).toThrow(/cannot read the admin token from .*missing\/secrets\.json: ENOENT/);
    writeFileSync(join(dir, 'secrets.json'), 'not json secret-value');
    chmodSync(join(dir, 'secrets.json'), 0o600);
    expect(() => readAdminToken(dir)).toThrow(/not JSON$/);
    expect(() => readAdminToken(dir)).not.toThrow(/secret-value/);
  });

  it('records where canto up serves', () => {
    const dir = join(root, 'new');
    expect(recordedApiUrl(dir)).toBeNull();
    recordApiUrl(dir, 'http://127.0.0.1:8123');
    expect(recordedApiUrl(dir)).toBe('http://127.0.0.1:8123');
  });
});
