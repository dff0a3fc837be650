/**
 * The web console's static route over a real socket: the redirect to `/console/`, content types,
 * the Content-Security-Policy on every answer (without `unsafe-inline`), no credential needed,
 * problem+json 404s for missing files, the few browser-library files it serves from node_modules
 * and none other, and no way out of the console folder (dot segments, encoded or not,
 * backslashes, NUL). Raw HTTP requests: fetch would normalise `..` away.
 */
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { consoleFile, CONSOLE_CSP } from '../../scheduler/src/http/routes/console.js';
import { readResponse, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { expectProblem } from '../helpers/problem.js';

interface RawAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

function raw(base: string, path: string): Promise<RawAnswer> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, path, method: 'GET', agent: false }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts).toString() }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

describe('the console static route', () => {
  let scheduler: TestScheduler;

  beforeAll(async () => {
    scheduler = await startTestScheduler();
  });

  afterAll(async () => {
    await scheduler?.close();
  });

  it('redirects /console to /console/ and serves the page with its policy, no credential needed', async () => {
    const bare = await raw(scheduler.url, '/console');
    expect(bare.status).toBe(301);
    expect(bare.headers.location).toBe('/console/');

    const page = await fetch(`${scheduler.url}/console/`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toBe('text/html; charset=utf-8');
    const csp = page.headers.get('content-security-policy') ?? '';
    expect(csp).toBe(CONSOLE_CSP);
    expect(csp).toContain("script-src 'self'");
    expect(csp).toContain("style-src 'self'");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).not.toContain('unsafe-inline');
    expect(csp).not.toContain('unsafe-eval');
    expect(page.headers.get('x-content-type-options')).toBe('nosniff');
    const html = await page.text();
    expect(html).toContain('<script type="module" src="js/main.js">');
    // Nothing inline for the policy to block: no script body, no style element or attribute.
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/);
    expect(html).not.toMatch(/<style|\sstyle=/);
    expect((await fetch(`${scheduler.url}/console/index.html`)).status).toBe(200);
  });

  it('serves modules as text/javascript, the stylesheet as text/css and the icon as SVG', async () => {
    const js = await fetch(`${scheduler.url}/console/js/main.js`);
    expect(js.status).toBe(200);
    expect(js.headers.get('content-type')).toBe('text/javascript; charset=utf-8');
    expect(js.headers.get('content-security-policy')).toBe(CONSOLE_CSP);
    expect(await js.text()).toContain("from './api.js'");
    const view = await fetch(`${scheduler.url}/console/js/views/files.js`);
    expect(view.headers.get('content-type')).toBe('text/javascript; charset=utf-8');
    const css = await fetch(`${scheduler.url}/console/console.css`);
    expect(css.headers.get('content-type')).toBe('text/css; charset=utf-8');
    expect((await fetch(`${scheduler.url}/console/favicon.svg`)).headers.get('content-type')).toBe('image/svg+xml');
  });

  it('serves the browser libraries the console loads from node_modules, and nothing else of them', async () => {
    for (const [path, type] of [
      ['vendor/novnc/core/rfb.js', 'text/javascript; charset=utf-8'],
      ['vendor/novnc/core/input/keyboard.js', 'text/javascript; charset=utf-8'],
      ['vendor/novnc/vendor/pako/lib/zlib/inflate.js', 'text/javascript; charset=utf-8'],
      ['vendor/xterm/lib/xterm.mjs', 'text/javascript; charset=utf-8'],
      ['vendor/xterm/css/xterm.css', 'text/css; charset=utf-8'],
      ['vendor/xterm-addon-fit/lib/addon-fit.mjs', 'text/javascript; charset=utf-8'],
    ] as const) {
      const res = await fetch(`${scheduler.url}/console/${path}`);
      expect(res.status, path).toBe(200);
      expect(res.headers.get('content-type'), path).toBe(type);
      expect(res.headers.get('content-security-policy'), path).toBe(CONSOLE_CSP);
    }
    expect(await (await fetch(`${scheduler.url}/console/vendor/novnc/core/rfb.js`)).text()).toContain('export default class RFB');
    for (const path of [
      'vendor/novnc/package.json',
      'vendor/novnc/docs/API.md',
      'vendor/novnc/vendor/pako/README.md',
      'vendor/xterm/lib/xterm.js',
      'vendor/xterm/lib/xterm.mjs.map',
      'vendor/xterm/package.json',
      'vendor/xterm-addon-fit/lib/addon-fit.js',
      'vendor/sharp/lib/index.js',
      'vendor/novnc',
      'vendor/',
      'vendor/__proto__/x.js',
    ]) {
      const res = await readResponse(await fetch(`${scheduler.url}/console/${path}`));
      expectProblem(res, 404, path);
    }
    for (const path of ['/console/vendor/novnc/core/../../../package.json', '/console/vendor/novnc/core/%2e%2e/package.json', '/console/vendor/xterm/lib%2f..%2fpackage.json']) {
      const res = await raw(scheduler.url, path);
      expect(res.status, path).toBe(404);
      expect(res.body, path).not.toContain('"version"');
    }
  });

  it('answers 404 problem+json for missing files, folders and paths outside the console', async () => {
    for (const path of ['/console/nope.js', '/console/js/', '/console/js', '/console/js/views/nope.js']) {
      const res = await readResponse(await fetch(`${scheduler.url}${path}`));
      expectProblem(res, 404, path);
      expect(res.headers.get('content-security-policy'), path).toBe(CONSOLE_CSP);
    }
    for (const path of [
      '/console/../package.json',
      '/console/%2e%2e/package.json',
      '/console/js/%2e%2e/%2e%2e/package.json',
      '/console/..%2fpackage.json',
      '/console/..%5cpackage.json',
      '/console/%2e%2e%2f%2e%2e%2fscheduler/src/main.ts',
      '/console/js%2f..%2f..%2fpackage.json',
      '/console/index.html%00.js',
      '/console/%2fetc/passwd',
    ]) {
      const res = await raw(scheduler.url, path);
      expect(res.status, path).toBe(404);
      expect(res.body, path).not.toContain('"name": "canto"');
      expect(res.body, path).not.toContain('root:');
    }
  });

  it('resolves request paths only to files inside the folder', () => {
    const root = mkdtempSync(join(tmpdir(), 'canto-console-'));
    try {
      mkdirSync(join(root, 'js'));
      writeFileSync(join(root, 'index.html'), '');
      expect(consoleFile(root, '')).toBe(join(root, 'index.html'));
      expect(consoleFile(root, 'js/')).toBe(join(root, 'js', 'index.html'));
      expect(consoleFile(root, 'js/main.js')).toBe(join(root, 'js', 'main.js'));
      for (const bad of ['../x', 'js/../../x', '..', '.env', 'js/.hidden', '/etc/passwd', 'a\\..\\b', 'a\0b']) {
        expect(consoleFile(root, bad), bad).toBeNull();
      }
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});
