/**
 * Computer-use benchmarks: screenshots and input batches through the API (HTTP, auth, database
 * lookup, agent link, agent, guest), each against what a client without this API would run in
 * the same desktop: `xwd | convert` for a PNG of the screen, and `xdotool` for the same input.
 * The baselines are timed inside the guest, so they exclude every cost of reaching it and the
 * ratios flatter them.
 */
import { request } from 'node:http';
import { median, percentile, table, timed, type Row } from './stats.js';

export interface ComputerUseBenchContext {
  readonly schedulerUrl: string;
  readonly apiKey: string;
  readonly runs: number;
}

const SHOTS = 60;
const INPUT_RUNS = 20;
const TWENTY_CHARS = 'hello world, canto!!';

/** A plain node:http POST (fetch's web streams add client-side cost that is not the service's). */
function post(url: string, headers: Record<string, string>, body: unknown): Promise<{ status: number; body: Buffer }> {
  const data = Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', headers: { ...headers, 'content-type': 'application/json', 'content-length': String(data.length) } }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (chunk: Buffer) => parts.push(chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(parts) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(data);
  });
}

export async function benchComputerUse(ctx: ComputerUseBenchContext): Promise<void> {
  const headers = { authorization: `Bearer ${ctx.apiKey}` };
  const call = async (path: string, body: unknown = {}, method = 'POST') => {
    const res = await fetch(ctx.schedulerUrl + path, { method, headers: { ...headers, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const json = (await res.json()) as Record<string, unknown>;
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  const id = (await call('/v1/desktops', { tier: 'default' })).id as string;
  await call(`/v1/desktops/${id}/wake?wait=true`);
  const exec = async (command: string) => (await call(`/v1/desktops/${id}/exec`, { command })) as { exit_code: number; stdout: string; stderr: string };
  /** Microseconds a shell pipeline takes inside the guest, timed there. */
  const inGuestMs = async (pipeline: string): Promise<number> => {
    const out = await exec(`s=$(date +%s%N); ${pipeline}; e=$(date +%s%N); echo $(( (e - s) / 1000 ))`);
    if (out.exit_code !== 0) throw new Error(`baseline failed: ${out.stderr}`);
    return Number(out.stdout.trim().split('\n').pop()) / 1000;
  };
  const shot = async (body: unknown) => {
    const res = await post(`${ctx.schedulerUrl}/v1/desktops/${id}/screenshot`, headers, body);
    if (res.status !== 200) throw new Error(`screenshot: ${res.status} ${res.body.toString()}`);
    return res.body.length;
  };

  try {
    // Real content on the screen: two terminals full of text (an empty screen compresses to nothing).
    await call(`/v1/desktops/${id}/exec`, { command: 'DISPLAY=:0 xterm -geometry 120x50+0+0 -e "ls -lR /usr/share/doc | head -4000; sleep 100000"', detached: true });
    await call(`/v1/desktops/${id}/exec`, { command: 'DISPLAY=:0 xterm -geometry 100x40+500+300 -e "cat /etc/services; sleep 100000"', detached: true });
    await new Promise((r) => setTimeout(r, 1500));

    const rows: Row[] = [];
    const pctRows: string[] = [];
    for (const [width, height] of [[1024, 768], [2560, 1600]] as const) {
      await call(`/v1/desktops/${id}/display`, { width, height }, 'PUT');
      const baseline = `xwd -silent -root -display :0 | /usr/bin/convert xwd:- png:- > /dev/null`;
      const base: number[] = [];
      for (let i = 0; i < Math.max(5, Math.round(ctx.runs / 2)); i++) base.push(await inGuestMs(baseline));
      for (const encoding of ['binary', 'base64'] as const) {
        let bytes = 0;
        await shot({ encoding });
        const ms: number[] = [];
        for (let i = 0; i < SHOTS; i++) ms.push(await timed(async () => (bytes = await shot({ encoding }))));
        rows.push([`screenshot ${width}x${height} ${encoding} (${Math.round(bytes / 1024)} KiB)`, median(ms), median(base), 'ms', width === 1024 ? '< 20 ms p50' : '', ms]);
        pctRows.push(`| ${width}x${height} ${encoding} | ${median(ms).toFixed(1)} ms | ${percentile(ms, 99).toFixed(1)} ms |`);
      }
      process.stderr.write(`screenshots at ${width}x${height} done\r`);
    }
    await call(`/v1/desktops/${id}/display`, { width: 1024, height: 768 }, 'PUT');

    const move: number[] = [];
    const moveBase: number[] = [];
    const key: number[] = [];
    const keyBase: number[] = [];
    const type: number[] = [];
    const typeBase: number[] = [];
    for (let i = 0; i < INPUT_RUNS; i++) {
      const x = 100 + i;
      move.push(await timed(() => call(`/v1/desktops/${id}/input`, { actions: [{ type: 'mouse_move', x, y: 200 }] })));
      moveBase.push(await inGuestMs(`DISPLAY=:0 xdotool mousemove ${x} 300`));
      key.push(await timed(() => call(`/v1/desktops/${id}/input`, { actions: [{ type: 'key', combo: 'ctrl+Home' }] })));
      keyBase.push(await inGuestMs('DISPLAY=:0 xdotool key ctrl+Home'));
      type.push(await timed(() => call(`/v1/desktops/${id}/input`, { actions: [{ type: 'type', text: TWENTY_CHARS }] })));
      // This xdotool waits half its --delay per character: 24 types at 12 ms per key.
      typeBase.push(await inGuestMs(`DISPLAY=:0 xdotool type --delay 24 '${TWENTY_CHARS}'`));
    }
    rows.push(['input: mouse_move', median(move), median(moveBase), 'ms', '', move]);
    rows.push(['input: key ctrl+Home', median(key), median(keyBase), 'ms', '', key]);
    rows.push(['input: type 20 chars (12 ms per key)', median(type), median(typeBase), 'ms', '', type]);

    table(
      `Computer use (${SHOTS} shots per row, ${INPUT_RUNS} input batches) through the API; baseline = xwd | convert, or xdotool, timed inside the guest`,
      rows,
    );
    console.log('\nScreenshot latency percentiles through the API');
    console.log('| size, encoding | p50 | p99 |');
    console.log('|---|---:|---:|');
    for (const line of pctRows) console.log(line);
  } finally {
    await call(`/v1/desktops/${id}/destroy?wait=true`).catch(() => undefined);
  }
}
