/**
 * The web console's static files, served at `/console/` with no credential: the console is plain
 * HTML, CSS and ES modules that call the `/v1` API from the browser with the key the user pastes
 * in (kept in the tab's session storage), so serving it needs no build server and no session of
 * ours. Every answer carries a Content-Security-Policy without `unsafe-inline`: the console has no
 * inline script or style, so an injected one never runs.
 *
 * Only files under the console folder with a known extension are served, and under `vendor/` the
 * few library files the console loads from node_modules; anything else, a directory or a path
 * that would leave the folder included, is the same 404.
 */
import { existsSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { dirname, extname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyReply } from 'fastify';
import type { App } from '../route-types.js';
import { problem } from '../../errors.js';
import { vendorFile } from './console-vendor.js';

/** `ws:`/`wss:` for the live screen and terminal streams; `blob:`/`data:` for screenshots and downloads. */
export const CONSOLE_CSP = [
  "default-src 'self'",
  "img-src 'self' data: blob:",
  "connect-src 'self' ws: wss:",
  "style-src 'self'",
  "script-src 'self'",
  "font-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

const TYPES: Readonly<Record<string, string>> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.json': 'application/json',
};

/**
 * Where the console is: beside the bundle (dist/console/, copied by tsup.config.ts), or in the
 * source tree (console/, four folders up from this file). Null when neither exists.
 */
export function consoleFolder(): string | null {
  const here = dirname(fileURLToPath(import.meta.url));
  const candidates = [join(here, 'console'), join(here, '..', '..', '..', '..', 'console')];
  return candidates.find((dir) => existsSync(join(dir, 'index.html'))) ?? null;
}

/**
 * The file a request path names under `root`, or null when it is outside it or malformed.
 * `vendor/…` names a browser library's file in node_modules instead (console-vendor.ts).
 */
export function consoleFile(root: string, requested: string): string | null {
  if (requested.includes('\0') || requested.includes('\\')) return null;
  const relative = requested === '' || requested.endsWith('/') ? `${requested}index.html` : requested;
  // A dot segment anywhere (`..`, `.hidden`) is refused before resolving: nothing of ours is named so.
  if (relative.split('/').some((segment) => segment.startsWith('.'))) return null;
  if (relative.startsWith('vendor/')) return vendorFile(relative.slice('vendor/'.length));
  const file = resolve(root, relative);
  return file.startsWith(root + sep) ? file : null;
}

function notFound(reply: FastifyReply) {
  return reply.code(404).header('content-security-policy', CONSOLE_CSP).type('application/problem+json').send(problem(404, 'no such console file'));
}

export function registerConsoleRoutes(app: App, folder: string | null = consoleFolder()): void {
  const options = { config: { public: true }, schema: { hide: true } } as const;
  const root = folder === null ? null : resolve(folder);

  // Relative links in the page (`js/main.js`) resolve against the folder, so the page lives at `/console/`.
  app.get('/console', options, async (_request, reply) => reply.redirect('/console/', 301));

  app.get<{ Params: { '*': string } }>('/console/*', options, async (request, reply) => {
    const file = root === null ? null : consoleFile(root, request.params['*']);
    const type = file === null ? undefined : TYPES[extname(file)];
    if (file === null || type === undefined) return notFound(reply);
    const info = await stat(file).catch(() => null);
    if (!info?.isFile()) return notFound(reply);
    const body = await readFile(file);
    return reply
      .header('content-security-policy', CONSOLE_CSP)
      .header('x-content-type-options', 'nosniff')
      .header('referrer-policy', 'no-referrer')
      // Revalidated on every load: a scheduler upgrade changes the files under the same names.
      .header('cache-control', 'no-cache')
      .type(type)
      .send(body);
  });
}
