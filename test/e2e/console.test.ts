/**
 * The web console in a real browser (headless Chromium through playwright-core), against the real
 * scheduler serving it and a real sandbox agent: sign in with a key, create and wake a desktop
 * while the operation's progress shows, a thumbnail that is a real PNG of the desktop's screen,
 * an upload and a download of a file larger than one 8 MiB window (bytes compared), a port
 * published with its URL listed, the usage chart, hibernate, a fork of two copies and destroy
 * from the list, another org's desktop never shown, the key in session storage only (never in a
 * URL or local storage), and no Content-Security-Policy violation in the page. The live screen
 * and terminal tabs are in console-live.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import sharp from 'sharp';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { openConsoleBrowser, type ConsoleBrowser } from '../helpers/browser.js';

const isRoot = process.getuid?.() === 0;

describe.skipIf(!isRoot)('the web console in headless Chromium', () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let browser: ConsoleBrowser;
  let page: Page;
  let key: string;
  let call: ReturnType<typeof api>;
  let otherId: string;
  let id: string;

  /** Everything the page shows, for checks of what must never appear in it. */
  const shown = () => page.evaluate(() => (globalThis as any).document.documentElement.outerHTML as string);

  /** A guest file read through the API in 8 MiB windows, as a whole read is capped at one. */
  async function readGuestFile(path: string): Promise<Buffer> {
    const parts: Buffer[] = [];
    for (let offset = 0; ; ) {
      const res = await fetch(`${scheduler.url}/v1/desktops/${id}/files/${path}?offset=${offset}&length=${8 * 1024 * 1024}`, { headers: { authorization: `Bearer ${key}` } });
      expect(res.status).toBe(200);
      const part = Buffer.from(await res.arrayBuffer());
      parts.push(part);
      offset += part.length;
      if (res.headers.get('x-svc-eof') === 'true' || part.length === 0) return Buffer.concat(parts);
    }
  }

  beforeAll(async () => {
    scheduler = await startTestScheduler({ CANTO_INGRESS_BASE_URL: 'http://apps.canto.test', CANTO_INGRESS_LISTEN: '127.0.0.1:0' });
    agent = await startSandboxAgent(scheduler.url);
    key = await mintKey(scheduler.databaseUrl, 'console-e2e');
    call = api(scheduler.url, key);
    // Another org's desktop: the console signed in as the first org must never show it.
    const other = api(scheduler.url, await mintKey(scheduler.databaseUrl, 'console-e2e-other'));
    otherId = (await other('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect(otherId).toMatch(/^dsk_/);

    browser = await openConsoleBrowser({ acceptDownloads: true });
    page = browser.page;
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    await agent?.stop();
    await scheduler?.close();
  });

  it('opens on a sign-in screen that says where the key is, under a policy without unsafe-inline', async () => {
    const res = await page.goto(`${scheduler.url}/console`);
    expect(page.url()).toBe(`${scheduler.url}/console/`);
    const csp = res!.headers()['content-security-policy'] ?? '';
    expect(csp).toContain("script-src 'self'");
    expect(csp).not.toContain('unsafe-inline');
    const welcome = page.locator('#welcome');
    await expect.poll(() => welcome.textContent()).toContain('API key:');
    expect(await welcome.textContent()).toContain('create your first desktop');

    await page.fill('#api-key', 'svc_sk_not-a-real-key');
    await page.click('#sign-in button[type=submit]');
    await expect.poll(() => page.locator('#sign-in-error').textContent()).toContain('not accepted');

    await page.fill('#api-key', key);
    await page.click('#sign-in button[type=submit]');
    await expect.poll(() => page.locator('#first-desktop').textContent().catch(() => '')).toContain('Create your first desktop');
  });

  it('creates a desktop and wakes it, showing the operation until it succeeds', async () => {
    await page.selectOption('#new-tier', 'small');
    await page.click('#create-desktop');
    const row = page.locator('#desktops tr[data-desktop]');
    await expect.poll(() => row.count()).toBe(1);
    id = (await row.getAttribute('data-desktop'))!;
    expect(id).toMatch(/^dsk_/);
    expect(id).not.toBe(otherId);

    // Every state the wake's line shows, recorded as the page draws it.
    await page.evaluate(() => {
      const w = globalThis as any;
      const states: string[] = [];
      w.wakeStates = states;
      new w.MutationObserver(() => {
        const line = w.document.querySelector('#operations li[data-kind="wake"]');
        const state = line?.getAttribute('data-state');
        if (state && states.at(-1) !== state) states.push(state);
      }).observe(w.document.body, { subtree: true, childList: true, attributes: true });
    });
    await page.locator(`tr[data-desktop="${id}"] button[data-action="wake"]`).click();
    const line = page.locator('#operations li[data-kind="wake"]');
    await expect.poll(() => line.getAttribute('data-state'), { timeout: 30_000 }).toBe('succeeded');
    expect(await line.getAttribute('data-operation')).toMatch(/^op_/);
    const states = await page.evaluate(() => (globalThis as any).wakeStates as string[]);
    expect(states.at(-1)).toBe('succeeded');
    expect(states.some((s) => s === 'pending' || s === 'running'), states.join(',')).toBe(true);
    await expect.poll(() => page.locator(`tr[data-desktop="${id}"]`).getAttribute('data-state'), { timeout: 10_000 }).toBe('awake');
    expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');
  }, 45_000);

  it('shows a thumbnail that is a real PNG of the desktop screen', async () => {
    // A window on the screen, so the picture has something in it; a reload takes a fresh thumbnail
    // (and shows the key survives a reload of the tab).
    const opened = await call('POST', `/v1/desktops/${id}/exec`, { command: 'xterm -geometry 80x24+0+0 -bg white -fg black', detached: true });
    expect(opened.status, opened.text).toBe(202);
    const shownUp = await call('POST', `/v1/desktops/${id}/exec`, { command: 'xdotool search --sync --onlyvisible --class xterm', timeout_secs: 20 });
    expect(shownUp.json.exit_code, shownUp.text).toBe(0);
    // The bytes the page receives, taken on their way to it (the page itself may read its blob
    // only into an <img>: the policy keeps blob: out of connect-src).
    const pngs: Buffer[] = [];
    await page.route(`**/v1/desktops/${id}/screenshot`, async (route) => {
      const answer = await route.fetch();
      const body = await answer.body();
      if (answer.ok()) pngs.push(body);
      await route.fulfill({ response: answer, body });
    });
    await page.reload();
    const img = page.locator(`img[data-thumbnail="${id}"]`);
    await expect.poll(() => img.evaluate((el: any) => el.complete && el.naturalWidth).catch(() => 0), { timeout: 10_000 }).toBeGreaterThan(0);
    expect(await img.getAttribute('src')).toMatch(/^blob:/);
    await page.unroute(`**/v1/desktops/${id}/screenshot`);
    const png = pngs.at(-1)!;

    expect(png.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
    const display = (await call('GET', `/v1/desktops/${id}/display`)).json;
    const { data, info } = await sharp(png).removeAlpha().raw().toBuffer({ resolveWithObject: true });
    expect(info.width).toBe(Math.round(display.width / 4));
    expect(info.height).toBe(Math.round(display.height / 4));
    expect(await img.evaluate((el: any) => el.naturalWidth)).toBe(info.width);
    // The same picture the API gives at the same scale: the white terminal at the top left.
    const direct = await fetch(`${scheduler.url}/v1/desktops/${id}/screenshot`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ scale_percent: 25 }),
    });
    const reference = await sharp(Buffer.from(await direct.arrayBuffer())).removeAlpha().raw().toBuffer();
    expect(reference.length).toBe(data.length);
    let differing = 0;
    for (let i = 0; i < data.length; i++) if (Math.abs(data[i]! - reference[i]!) > 16) differing++;
    expect(differing / data.length).toBeLessThan(0.02);
    const pixel = (x: number, y: number) => data[(y * info.width + x) * 3]!;
    expect(pixel(20, 20)).toBeGreaterThan(200);
    expect(pixel(info.width - 5, info.height - 5)).toBeLessThan(200);
  }, 45_000);

  it('uploads a file into the desktop and downloads the same bytes', async () => {
    await page.click(`a[href="#/desktops/${id}/files"]`);
    await expect.poll(() => page.locator('#files-path').inputValue().catch(() => '')).toBe('/root');
    // Larger than one 8 MiB window: the upload appends a second chunk, the download reads two windows.
    const bytes = randomBytes(8 * 1024 * 1024 + 4321);
    await page.setInputFiles('#upload', { name: 'payload.bin', mimeType: 'application/octet-stream', buffer: bytes });
    await expect.poll(() => page.locator('#files tr[data-name="payload.bin"]').count(), { timeout: 20_000 }).toBe(1);
    expect(await page.locator('#files-message').textContent()).toContain('Uploaded payload.bin');
    expect((await readGuestFile('root/payload.bin')).equals(bytes)).toBe(true);

    const [download] = await Promise.all([page.waitForEvent('download'), page.click('button[data-download="payload.bin"]')]);
    expect(download.suggestedFilename()).toBe('payload.bin');
    expect(readFileSync((await download.path())!).equals(bytes)).toBe(true);
  }, 45_000);

  it('publishes a port and lists it with its URL', async () => {
    await page.click('a[data-tab="ports"]');
    await page.locator('#new-port').fill('8000');
    await page.click('#port-form button[type=submit]');
    const url = `http://8000-${id}.apps.canto.test`;
    await expect.poll(() => page.locator('#ports tr[data-port="8000"] a.port-url').textContent().catch(() => '')).toBe(url);
    expect(await page.locator('#ports tr[data-port="8000"] a.port-url').getAttribute('href')).toBe(url);
    expect((await call('GET', `/v1/desktops/${id}/ports`)).json.ports.map((p: { url: string }) => p.url)).toEqual([url]);
  });

  it('draws usage with a bar for the awake desktop', async () => {
    await page.click('nav a[data-nav="usage"]');
    const bar = page.locator(`#usage-chart g[data-desktop="${id}"] rect.bar`);
    await expect.poll(() => bar.count(), { timeout: 10_000 }).toBe(1);
    expect(Number(await bar.getAttribute('width'))).toBeGreaterThan(0);
    expect(await page.locator('#usage-total').textContent()).toMatch(/^\$\d+\.\d\d$/);
    expect(await page.locator('#usage-chart g[data-desktop]').count()).toBe(1);
    expect(await shown()).not.toContain(otherId);
  });

  it("never shows another org's desktop, even asked for by id", async () => {
    await page.click('nav a[data-nav="desktops"]');
    // Rows of the desktops view itself: until the hash change is handled, the usage view's table
    // (rows of the same desktops) is still the page.
    await expect.poll(() => page.locator(`#desktops tr[data-desktop="${id}"]`).count()).toBe(1);
    expect(await page.locator('#desktops tr[data-desktop]').count()).toBe(1);
    expect(await shown()).not.toContain(otherId);
    await page.goto(`${scheduler.url}/console/#/desktops/${otherId}/files`);
    await expect.poll(() => page.locator('#desktop-missing').count()).toBe(1);
    const missing = await page.locator('#desktop-missing').textContent();
    await page.goto(`${scheduler.url}/console/#/desktops/dsk_000000000000000000000000/files`);
    await expect.poll(() => page.locator('#desktop-missing').count()).toBe(1);
    // Exactly as a desktop that does not exist.
    expect(await page.locator('#desktop-missing').textContent()).toBe(missing);
  });

  it('hibernates, forks and destroys from the list, each with its operation', async () => {
    await page.goto(`${scheduler.url}/console/#/desktops`);
    const original = page.locator(`tr[data-desktop="${id}"]`);
    const settled = (kind: string) => page.locator(`#operations li[data-kind="${kind}"]`).first().getAttribute('data-state').catch(() => null);
    await original.locator('button[data-action="hibernate"]').click();
    await expect.poll(() => settled('hibernate'), { timeout: 30_000 }).toBe('succeeded');
    await expect.poll(() => original.getAttribute('data-state'), { timeout: 10_000 }).toBe('hibernated');

    // Fork asks for a second click (the copies share the desktop's state and secrets), and how many.
    const fork = original.locator('button[data-action="fork"]');
    await fork.click();
    await expect.poll(() => fork.textContent()).toContain('Confirm fork');
    expect(await page.locator('#operations li[data-kind="fork"]').count()).toBe(0);
    await page.locator(`input[data-fork-count="${id}"]`).fill('2');
    await fork.click();
    await expect.poll(() => settled('fork'), { timeout: 45_000 }).toBe('succeeded');
    await expect.poll(() => page.locator('tr[data-desktop]').count(), { timeout: 10_000 }).toBe(3);
    const forkIds = await page.locator(`tr[data-desktop]:not([data-desktop="${id}"])`).evaluateAll((rows) => rows.map((r) => r.getAttribute('data-desktop')!));
    const line = await page.locator('#operations li[data-kind="fork"]').first().textContent();
    for (const forkId of forkIds) expect(line).toContain(forkId);
    expect(forkIds).not.toContain(otherId);
    const forkId = forkIds[0]!;

    const copy = page.locator(`tr[data-desktop="${forkId}"]`);
    await copy.locator('button[data-action="destroy"]').click();
    await copy.locator('button[data-action="destroy"]').click();
    await expect.poll(() => settled('destroy'), { timeout: 30_000 }).toBe('succeeded');
    await expect.poll(() => copy.count(), { timeout: 10_000 }).toBe(0);
    const after = await call('GET', `/v1/desktops/${forkId}`);
    expect(after.status === 404 || after.json.state === 'destroyed', after.text).toBe(true);
    expect(await original.getAttribute('data-state')).toBe('hibernated');
    expect(await page.locator(`tr[data-desktop="${forkIds[1]}"]`).count()).toBe(1);
  }, 90_000);

  it('keeps the key out of every URL and out of local storage, and the page meets its policy', async () => {
    const { requested, violations, problems } = browser;
    expect(requested.length).toBeGreaterThan(10);
    for (const url of requested) expect(url).not.toContain(key);
    expect(page.url()).not.toContain(key);
    const storage = await page.evaluate(() => {
      const w = globalThis as any;
      return { local: JSON.stringify({ ...w.localStorage }), session: JSON.stringify({ ...w.sessionStorage }), cookie: w.document.cookie as string };
    });
    expect(storage.local).not.toContain(key);
    expect(storage.cookie).not.toContain(key);
    expect(storage.session).toContain(key);
    expect(await shown()).not.toContain(key);

    await until(() => page.evaluate(() => (globalThis as any).document.readyState === 'complete'));
    expect(violations).toEqual([]);
    expect(problems).toEqual([]);

    await page.click('#sign-out');
    await expect.poll(() => page.locator('#welcome').count()).toBe(1);
    expect(await page.evaluate(() => JSON.stringify({ ...(globalThis as any).sessionStorage }))).not.toContain(key);
  });
});
