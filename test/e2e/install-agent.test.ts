/**
 * `scripts/install-agent --root DIR` writes the agent's environment file (0600, it holds the join
 * token) and a systemd unit that leaves desktops running when the agent stops; the environment
 * file is a valid agent configuration, and the token never appears in the script's output.
 */
import { describe, expect, it, afterAll } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { loadAgentConfig } from '../../agent/src/config.js';

const run = promisify(execFile);
const script = join(import.meta.dirname, '..', '..', 'scripts', 'install-agent');

describe('scripts/install-agent', () => {
  const root = mkdtempSync(join(tmpdir(), 'canto-install-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  it('writes a private env file and a unit that keeps desktops running', async () => {
    const token = 'join-token-that-must-stay-secret';
    const tokenFile = join(root, 'join-token');
    writeFileSync(tokenFile, `${token}\n`, { mode: 0o600 });
    const out = await run('bash', [script, '--scheduler', 'https://a.example,https://b.example', '--token-file', tokenFile, '--root', root]);
    expect(out.stdout + out.stderr).not.toContain(token);

    const envPath = join(root, 'etc/canto/agent.env');
    expect(statSync(envPath).mode & 0o777).toBe(0o600);
    const env = Object.fromEntries(
      readFileSync(envPath, 'utf8').trim().split('\n').map((line) => line.split(/=(.*)/s).slice(0, 2) as [string, string]),
    );
    const config = loadAgentConfig(env);
    expect(config.schedulerUrls).toEqual(['https://a.example', 'https://b.example']);
    expect(config.token).toBe(token);
    expect(config.stateDir).toBe('/var/lib/canto-agent');

    const unit = readFileSync(join(root, 'etc/systemd/system/canto-agent.service'), 'utf8');
    expect(unit).toContain('EnvironmentFile=/etc/canto/agent.env');
    expect(unit).toMatch(/^ExecStart=\/\S+\/node \/\S+\/dist\/cli\.js agent$/m);
    expect(unit).toContain('KillMode=process');
    expect(unit).not.toContain(token);
  });

  it('refuses to run without a scheduler and a token, and refuses a token on its command line', async () => {
    const tokenFile = join(root, 'other-token');
    writeFileSync(tokenFile, 'x\n');
    await expect(run('bash', [script, '--token-file', tokenFile, '--root', root])).rejects.toMatchObject({ code: 2 });
    writeFileSync(tokenFile, 'has space\n');
    await expect(run('bash', [script, '--scheduler', 'https://a', '--token-file', tokenFile, '--root', root])).rejects.toMatchObject({ code: 2 });
    await expect(run('bash', [script, '--scheduler', 'https://a', '--token-file', join(root, 'missing'), '--root', root])).rejects.toMatchObject({ code: 2 });
    const onCommandLine = run('bash', [script, '--scheduler', 'https://a', '--token', 'visible-in-ps', '--root', root]);
    await expect(onCommandLine).rejects.toMatchObject({ code: 2, stderr: expect.stringContaining('--token-file') });
  });
});
