/**
 * Headless Chromium for the console's browser tests (Debian's `chromium`, installed by
 * scripts/setup, driven through playwright-core). One page whose Content-Security-Policy
 * violations, failed console-file loads, policy messages and page errors are collected as they
 * happen, so a test can assert at its end that there were none, pages navigated away from
 * included.
 */
import { existsSync } from 'node:fs';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';

export const CHROMIUM = '/usr/bin/chromium';
// Without the background-networking switches Chromium dials out at start, and a closed network refuses it.
const ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

export interface ConsoleBrowser {
  readonly browser: Browser;
  readonly context: BrowserContext;
  readonly page: Page;
  /** Every URL the page requested. */
  readonly requested: string[];
  /** Console files that failed to load, policy refusals in the console log, page errors. */
  readonly problems: string[];
  /** `securitypolicyviolation` events, as "directive blocked-uri". */
  readonly violations: string[];
  close(): Promise<void>;
}

export async function openConsoleBrowser(options: { acceptDownloads?: boolean } = {}): Promise<ConsoleBrowser> {
  // Not a skip: scripts/setup (run by `npm test`) installs it, and a console nobody tested is broken.
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: run scripts/setup as root (it installs Debian's chromium)`);
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS });
  const requested: string[] = [];
  const problems: string[] = [];
  const violations: string[] = [];
  const context = await browser.newContext({ acceptDownloads: options.acceptDownloads ?? false });
  await context.exposeFunction('reportCspViolation', (violation: string) => violations.push(violation));
  await context.addInitScript(() => {
    const w = globalThis as any;
    w.document.addEventListener('securitypolicyviolation', (e: any) => void w.reportCspViolation(`${e.violatedDirective} ${e.blockedURI}`));
  });
  const page = await context.newPage();
  page.on('request', (r) => requested.push(r.url()));
  // A console file the page asks for and does not get (a module, the icon) is a broken console.
  page.on('response', (r) => {
    if (r.status() >= 400 && !new URL(r.url()).pathname.startsWith('/v1/')) problems.push(`${r.status()} ${r.url()}`);
  });
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused to/i.test(m.text())) problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  return { browser, context, page, requested, problems, violations, close: () => browser.close() };
}

/** Signs the console in with `key` and waits for the desktop list. */
export async function signIn(page: Page, consoleUrl: string, key: string): Promise<void> {
  await page.goto(consoleUrl);
  await page.locator('#api-key').waitFor();
  await page.fill('#api-key', key);
  await page.click('#sign-in button[type=submit]');
  await page.locator('#desktops').waitFor();
}
