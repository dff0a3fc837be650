/**
 * The console's live screen and terminal tabs in a real browser (headless Chromium through
 * playwright-core), against the real scheduler and a real sandbox agent. The screen: noVNC over
 * the stream's WebSocket, view-only until the control claim is taken; keys typed while viewing
 * never reach the desktop, keys typed with control do (seen twice: the canvas's pixels change,
 * and the program they were typed into wrote them to a file). The terminal: xterm.js over a
 * terminal ticket, `echo` read back from the page, the pty's size following the tab's, the exit
 * status shown, the socket closed when the tab is left. Another org's desktop is never shown, and
 * the page raises no Content-Security-Policy violation (xterm's run-time styles included).
 */
import { randomBytes } from 'node:crypto';
import type { Page, WebSocket as PageSocket } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { openConsoleBrowser, signIn, type ConsoleBrowser } from '../helpers/browser.js';

const isRoot = process.getuid?.() === 0;
/** Where the typed keys land: a file the API can read once control is given back. */
const TYPED = '/root/typed.txt';

describe.skipIf(!isRoot)("the console's live screen and terminal in headless Chromium", () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let browser: ConsoleBrowser;
  let page: Page;
  let key: string;
  let call: ReturnType<typeof api>;
  let otherId: string;
  let id: string;
  const sockets: PageSocket[] = [];

  /** Keeps the live screen's current pixels in the page, to compare later ones with. */
  const snapshot = () =>
    page.evaluate(() => {
      const w = globalThis as any;
      const canvas = w.document.querySelector('#screen canvas');
      w.screenSnapshot = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
      return { width: canvas.width as number, height: canvas.height as number };
    });

  /**
   * How many pixels differ from the snapshot (-1 when the size changed) in the terminal's first
   * lines, where typed lines appear. Only there, and not counting changes that span no more
   * columns than two mouse pointers (a 17x17 sprite that x11vnc may draw into the frame): the
   * pointer moves wherever the control connection's first pointer event puts it, typed or not,
   * and may leave one place and appear in another within the lines. A typed line spans more.
   */
  const changedPixels = () =>
    page.evaluate(() => {
      const w = globalThis as any;
      const canvas = w.document.querySelector('#screen canvas');
      if (!canvas || canvas.width === 0) return -1;
      const now = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
      const before = w.screenSnapshot;
      if (now.length !== before.length) return -1;
      let changed = 0;
      const columns = new Set<number>();
      for (let y = 0; y < 48; y++) {
        for (let x = 0; x < 480; x++) {
          const i = (y * canvas.width + x) * 4;
          if (now[i] !== before[i] || now[i + 1] !== before[i + 1] || now[i + 2] !== before[i + 2]) {
            changed++;
            columns.add(x);
          }
        }
      }
      return columns.size <= 2 * 17 ? 0 : changed;
    });

  /** Light pixels on the live screen: the white terminal window once it is drawn. */
  const lightPixels = () =>
    page.evaluate(() => {
      const canvas = (globalThis as any).document.querySelector('#screen canvas');
      if (!canvas || canvas.width === 0) return 0;
      const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
      let light = 0;
      for (let i = 0; i < data.length; i += 4) if (data[i] > 200 && data[i + 1] > 200 && data[i + 2] > 200) light++;
      return light;
    });

  /** Where a desktop position is on the page (the canvas is scaled to fit the tab). */
  async function pageAt(x: number, y: number): Promise<[number, number]> {
    const box = (await page.locator('#screen canvas').boundingBox())!;
    const size = await page.evaluate(() => {
      const canvas = (globalThis as any).document.querySelector('#screen canvas');
      return { width: canvas.width as number, height: canvas.height as number };
    });
    return [box.x + (x * box.width) / size.width, box.y + (y * box.height) / size.height];
  }

  /** Clicks the live screen at a desktop position. */
  async function clickDesktopAt(x: number, y: number) {
    await page.mouse.click(...(await pageAt(x, y)));
  }

  const terminalText = () => page.locator('#terminal .xterm-rows').textContent().then((t) => t ?? '');

  beforeAll(async () => {
    scheduler = await startTestScheduler();
    agent = await startSandboxAgent(scheduler.url);
    key = await mintKey(scheduler.databaseUrl, 'console-live');
    call = api(scheduler.url, key);
    const other = api(scheduler.url, await mintKey(scheduler.databaseUrl, 'console-live-other'));
    otherId = (await other('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect(otherId).toMatch(/^dsk_/);
    browser = await openConsoleBrowser();
    page = browser.page;
    page.on('websocket', (ws) => sockets.push(ws));
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    await agent?.stop();
    await scheduler?.close();
  });

  it('signs in, creates a desktop and wakes it', async () => {
    await signIn(page, `${scheduler.url}/console/`, key);
    await page.click('#create-desktop');
    const row = page.locator('#desktops tr[data-desktop]');
    await expect.poll(() => row.count()).toBe(1);
    id = (await row.getAttribute('data-desktop'))!;
    expect(id).not.toBe(otherId);
    await page.locator(`tr[data-desktop="${id}"] button[data-action="wake"]`).click();
    await expect.poll(() => page.locator(`tr[data-desktop="${id}"]`).getAttribute('data-state'), { timeout: 30_000 }).toBe('awake');
  }, 45_000);

  it('shows the screen view-only, and passes typed keys to the desktop only with the control claim', async () => {
    // A white terminal at the top left whose program writes every line typed into it to a file.
    // Its text cursor is drawn the same focused or not (alwaysHighlight): without a window
    // manager the focus follows the pointer, which the control connection may move.
    const xterm = `xterm -xrm 'XTerm*alwaysHighlight: true' -geometry 80x24+0+0 -bg white -fg black`;
    const started = await call('POST', `/v1/desktops/${id}/exec`, { command: `${xterm} -e sh -c 'cat > ${TYPED}'`, detached: true });
    expect(started.status, started.text).toBe(202);
    const mapped = await call('POST', `/v1/desktops/${id}/exec`, { command: 'xdotool search --sync --onlyvisible --class xterm', timeout_secs: 20 });
    expect(mapped.json.exit_code, mapped.text).toBe(0);

    await page.goto(`${scheduler.url}/console/#/desktops/${id}/screen`);
    const status = page.locator('#screen-status');
    await expect.poll(() => status.getAttribute('data-state'), { timeout: 15_000 }).toBe('view');
    expect(await page.locator('#take-control').isVisible()).toBe(true);
    const display = (await call('GET', `/v1/desktops/${id}/display`)).json;
    // The terminal is drawn: 80x24 cells of white at the top left, a dark desktop elsewhere.
    await expect.poll(lightPixels, { timeout: 15_000 }).toBeGreaterThan(100_000);
    const size = await snapshot();
    expect(size).toEqual({ width: display.width, height: display.height });
    const screenSocket = sockets.at(-1)!;
    expect(screenSocket.url()).toMatch(/\/vnc\?ticket=stk_/);

    // Viewing: a click and keys on the screen are not sent.
    await clickDesktopAt(100, 100);
    // Long enough that its echo would span far more columns than the pointer sprites.
    await page.keyboard.type('view only keys must never arrive\n');

    await page.click('#take-control');
    await expect.poll(() => status.getAttribute('data-state'), { timeout: 15_000 }).toBe('control');
    expect(screenSocket.isClosed()).toBe(true);
    // Chromium gives the control connection's canvas a pointer event where the mouse was left
    // (on the button, which can map onto the terminal's first lines): move it well away, so the
    // pointer sprite is drawn outside the lines compared below.
    await page.mouse.move(...(await pageAt(800, 650)));
    // The control connection's first full frame is the picture from before: nothing was typed.
    await expect.poll(changedPixels, { timeout: 15_000 }).toBe(0);
    expect((await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' })).status).toBe(409);

    await clickDesktopAt(100, 100);
    await page.keyboard.type('typed through the console\n');
    // The terminal echoes the keys: its black text appears on the white window.
    await expect.poll(changedPixels, { timeout: 15_000 }).toBeGreaterThan(50);

    await page.click('#release-control');
    await expect.poll(() => status.getAttribute('data-state'), { timeout: 15_000 }).toBe('view');
    // The claim ends with its connection; exec and files work again soon after.
    let typed = '';
    await until(async () => {
      const res = await fetch(`${scheduler.url}/v1/desktops/${id}/files${TYPED}`, { headers: { authorization: `Bearer ${key}` } });
      typed = res.status === 200 ? await res.text() : '';
      return typed.length > 0;
    }, 15_000, 'the typed line in the file');
    expect(typed).toBe('typed through the console\n');
  }, 90_000);

  it('runs echo in a terminal and reads the output back from the page', async () => {
    await page.click('a[data-tab="terminal"]');
    const status = page.locator('#terminal-status');
    await expect.poll(() => status.getAttribute('data-state'), { timeout: 15_000 }).toBe('open');
    // Leaving the screen tab closed its stream.
    expect(sockets.filter((s) => s.url().includes('/vnc?')).every((s) => s.isClosed())).toBe(true);
    const terminalSocket = sockets.at(-1)!;
    expect(terminalSocket.url()).toMatch(/\/terminal\?ticket=ttk_/);

    const marker = randomBytes(6).toString('hex');
    await page.click('#terminal');
    // The output differs from the typed line: only the shell's answer has "u42v".
    await page.keyboard.type(`echo "u$((40+2))v-${marker}"\n`);
    await expect.poll(terminalText, { timeout: 10_000 }).toContain(`u42v-${marker}`);

    // The pty has the size the page fits into the tab, and follows it when the tab changes.
    const box = page.locator('#terminal');
    const sizeOf = async () => `${await box.getAttribute('data-rows')} ${await box.getAttribute('data-cols')}`;
    const first = await sizeOf();
    await page.keyboard.type('echo "size=$(stty size)"\n');
    await expect.poll(terminalText, { timeout: 10_000 }).toContain(`size=${first}`);
    await page.setViewportSize({ width: 900, height: 600 });
    await expect.poll(sizeOf, { timeout: 10_000 }).not.toBe(first);
    const second = await sizeOf();
    await page.keyboard.type('clear; echo "size=$(stty size)"\n');
    await expect.poll(terminalText, { timeout: 10_000 }).toContain(`size=${second}`);

    // xterm's run-time styles applied, though the policy allows no inline style.
    const rows = await page.evaluate(() => {
      const w = globalThis as any;
      return { color: w.getComputedStyle(w.document.querySelector('#terminal .xterm-rows')).color as string, inline: w.document.querySelectorAll('style').length as number };
    });
    expect(rows).toEqual({ color: 'rgb(232, 232, 232)', inline: 0 });

    await page.keyboard.type('exit 3\n');
    await expect.poll(() => status.getAttribute('data-state'), { timeout: 10_000 }).toBe('exited');
    expect(await status.getAttribute('data-exit-code')).toBe('3');
    expect(await status.textContent()).toContain('status 3');
    await until(() => terminalSocket.isClosed(), 5_000, 'the exited terminal socket closed');
  }, 60_000);

  it('closes the terminal socket when the tab is left', async () => {
    await page.click('#terminal-again');
    await expect.poll(() => page.locator('#terminal-status').getAttribute('data-state'), { timeout: 15_000 }).toBe('open');
    const socket = sockets.at(-1)!;
    expect(socket.url()).toMatch(/\/terminal\?ticket=ttk_/);
    expect(socket.isClosed()).toBe(false);
    await page.click('a[data-tab="files"]');
    await until(() => socket.isClosed(), 5_000, 'the terminal socket closed');
  });

  it("never shows another org's desktop on the screen or terminal tab", async () => {
    for (const tab of ['screen', 'terminal']) {
      await page.goto(`${scheduler.url}/console/#/desktops/${otherId}/${tab}`);
      await expect.poll(() => page.locator('#desktop-missing').count()).toBe(1);
      expect(await page.locator('#screen, #terminal').count()).toBe(0);
    }
    expect(sockets.some((s) => s.url().includes(otherId))).toBe(false);
  });

  it('meets its Content-Security-Policy throughout', async () => {
    await until(() => page.evaluate(() => (globalThis as any).document.readyState === 'complete'));
    expect(browser.violations).toEqual([]);
    expect(browser.problems).toEqual([]);
    for (const url of browser.requested) expect(url).not.toContain(key);
  });
});
