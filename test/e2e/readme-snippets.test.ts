/**
 * The README's shell snippets are a tested path: pasted in order into bash beside a fresh
 * `npm start`, each must do what its comments say. This test runs them that way against a fresh
 * `canto up` (the built CLI, its own data directory and ports) and checks their output.
 *
 * Which blocks run, and how:
 * - Every ```sh or ```bash block of README.md runs, in document order, in one bash process under
 *   `set -euo pipefail`, so variables set by one snippet are there for the next, as in a
 *   terminal. Blocks fenced otherwise (the CLI synopsis) are not shell snippets.
 * - `<!-- snippet: skip -->` on the line right before a block leaves it out. It is for what cannot
 *   run inside a test: `npm start` and `npm test` themselves, the interactive VNC relay.
 * - A line that sets KEY, API or DATABASE_URL stands for what the reader's own `npm start` prints
 *   or uses. The README must give the values of a default start (a key placeholder, port 8080, the
 *   data directory /var/lib/canto); the test swaps in its own instance's.
 * - Snippets run in a scratch directory, where they write their files (screen.png, report.txt),
 *   and in which `dist` links to the built CLI, as in a checkout after `npm start`.
 * - curl runs with `--fail-with-body` (from a curlrc): the README's `curl -s` would print an error
 *   answer and carry on, which is how a reader sees it, but the test must stop there.
 * - PROMISES holds, for each snippet that runs, what its output must show. A README with more or
 *   fewer runnable snippets fails here until PROMISES says what the new ones promise.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { crashTree, freePort } from '../helpers/processes.js';
import { until } from '../helpers/scheduler.js';

const ROOT = join(import.meta.dirname, '..', '..');
const CLI = join(ROOT, 'dist', 'cli.js');
const isRoot = process.getuid?.() === 0;

/** The whole README run; each `?wait=true` in it answers within 120 s at worst. */
const RUN_DEADLINE_MS = 360_000;
/** `canto up` stopping hibernates what is awake first; past this it is killed. */
const STOP_DEADLINE_MS = 90_000;
const MARK = '@@readme-snippet';

interface Snippet {
  /** 1-based position among the README's shell blocks, skipped ones included. */
  block: number;
  line: number;
  text: string;
}

interface SnippetPromise {
  about: string;
  shows: RegExp[];
  /** Further checks on what the snippet left behind, given its output and the scratch directory. */
  check?: (output: string, scratch: string, instance: Instance) => Promise<void> | void;
}

interface Instance {
  api: string;
  key: string;
  dataDir: string;
}

/** The values the README must give for the instance's variables: those of a default `npm start`. */
const README_VALUES: Record<string, RegExp> = {
  KEY: /^svc_sk_(\.\.\.|…)$/,
  API: /^http:\/\/127\.0\.0\.1:8080\/v1$/,
  DATABASE_URL: /^postgres:\/\/canto@localhost\/canto\?host=\/var\/lib\/canto\/postgres\/run$/,
};
const INSTANCE_LINE = /^(export\s+)?(KEY|API|DATABASE_URL)=('[^']*'|"[^"]*"|\S+)(.*)$/;

const PROMISES: SnippetPromise[] = [
  {
    about: 'creates a desktop and wakes it',
    shows: [/"kind":"wake","state":"succeeded"/, /"id":"dsk_[0-9a-v]{24}"[^}]*"state":"awake"/, /"per_desktop":\[\{"desktop_id":"dsk_/],
  },
  {
    about: 'runs commands, a background job and file operations inside the desktop',
    shows: [
      /"exit_code":0,"stdout":"Linux [^"]*\\nhi\\n"/,
      /"status":"exited","exit_code":0,"stdout_tail":"step 1\\nstep 2\\nstep 3\\n"/,
      /"path":"root\/build","entries":\[\{"name":"step1\.log"/,
      /"path":"root\/report\.txt","fileType":"file","sizeBytes":18/,
      /\{"width":1280,"height":800\}/,
    ],
    check: (_output, scratch) => {
      expect(readFileSync(join(scratch, 'copy.txt'), 'utf8'), 'the file read back').toBe('quarterly numbers\n');
    },
  },
  {
    about: 'shows a terminal, takes screenshots and types into it',
    shows: [
      /"data_base64":"iVBOR[^"]*","width":400,"height":300/,
      /\{"cursor":\{"x":200,"y":150\}\}/,
      /"exit_code":0,"stdout":"hello\\n"/,
      /"url":"tcp:\/\/127\.0\.0\.1:\d+\/\?ticket=stk_[^"]+","claim":"view"/,
    ],
    check: (_output, scratch) => {
      const png = readFileSync(join(scratch, 'screen.png'));
      expect(png.subarray(1, 4).toString(), 'screen.png is a PNG').toBe('PNG');
      // IHDR: width and height, big-endian, at bytes 16 and 20.
      expect([png.readUInt32BE(16), png.readUInt32BE(20)], 'of the resized display').toEqual([1280, 800]);
    },
  },
  {
    about: 'publishes a port of an app in the desktop',
    shows: [/"port":8000,"public":false,"url":"http:\/\/8000-dsk_[0-9a-v]{24}\.localhost:\d+","status":"bound"/, /"token":"svc_pt_/, /^\/hello$/m],
  },
  {
    about: 'hibernates the desktop, forks it, wakes a fork and destroys the source',
    shows: [
      /"kind":"hibernate","state":"succeeded"/,
      /"kind":"fork","state":"succeeded","result":\{"desktop_ids":\["dsk_[0-9a-v]{24}","dsk_[0-9a-v]{24}"\]\}/,
      /"exit_code":0,"stdout":"quarterly numbers\\n"/,
      /"kind":"destroy","state":"succeeded"/,
    ],
  },
  {
    about: 'registers a webhook and reads its deliveries',
    shows: [/"id":"whk_[0-9a-v]{24}"[^}]*"secret":"svc_whsec_/, /\{"deliveries":\[/],
  },
  {
    about: 'creates, lists and revokes an API key',
    shows: [/"name":"ci","prefix":"svc_sk_[^"]+"[^}]*"key":"svc_sk_/, /\{"keys":\[/],
    check: async (output, _scratch, instance) => {
      const revoked = /"key":"(svc_sk_[^"]+)"/.exec(output)![1]!;
      const answer = await fetch(`${instance.api}/keys`, { headers: { authorization: `Bearer ${revoked}` } });
      expect(answer.status, 'the revoked key is refused').toBe(401);
    },
  },
  {
    about: "reaches canto up's database",
    shows: [/^ dsk_[0-9a-v]{24} \| awake/m, /^ dsk_[0-9a-v]{24} \| destroyed/m, /^ dsk_[0-9a-v]{24} \| hibernated/m, /\bleader\b/],
  },
];

/** The README's shell blocks, skipped ones left out. */
function shellSnippets(readme: string): Snippet[] {
  const lines = readme.split('\n');
  const out: Snippet[] = [];
  let block = 0;
  for (let i = 0; i < lines.length; i++) {
    const fence = /^```(\S*)\s*$/.exec(lines[i]!);
    if (!fence) continue;
    const end = lines.findIndex((l, j) => j > i && /^```\s*$/.test(l));
    if (end < 0) throw new Error(`README line ${i + 1}: a code block that is never closed`);
    if (fence[1] === 'sh' || fence[1] === 'bash') {
      block++;
      const before = lines.slice(0, i).reverse().find((l) => l.trim() !== '');
      if (before?.trim() !== '<!-- snippet: skip -->') out.push({ block, line: i + 2, text: lines.slice(i + 1, end).join('\n') });
    }
    i = end;
  }
  return out;
}

/** The snippet with the instance's values in place of a default start's; throws on a wrong default. */
function withInstance(snippet: Snippet, values: Record<string, string>): string {
  return snippet.text
    .split('\n')
    .map((line, n) => {
      const m = INSTANCE_LINE.exec(line);
      if (!m) return line;
      const [, exported = '', name = '', given = ''] = m;
      const unquoted = given.replace(/^(['"])(.*)\1$/, '$2');
      if (!README_VALUES[name]!.test(unquoted)) {
        throw new Error(`README line ${snippet.line + n}: ${name}=${given} is not what a default \`npm start\` prints or uses`);
      }
      return `${exported}${name}='${values[name]}'`;
    })
    .join('\n');
}

describe.skipIf(!isRoot)('the README, pasted in order', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'canto-readme-'));
  const scratch = mkdtempSync(join(tmpdir(), 'canto-readme-run-'));
  const children: ChildProcess[] = [];

  afterAll(async () => {
    const [up, ...rest] = children;
    for (const child of rest) if (child.exitCode === null && child.signalCode === null) crashTree(child.pid!);
    if (up && up.exitCode === null && up.signalCode === null) {
      const exited = new Promise((resolve) => up.once('exit', resolve));
      const tooLong = setTimeout(() => crashTree(up.pid!), STOP_DEADLINE_MS);
      up.kill('SIGINT');
      await exited;
      clearTimeout(tooLong);
    }
    // Desktops stay on disk when canto up stops (hibernated); a fork's disk is an overlay mount.
    const runtime = join(dataDir, 'agent', 'runtime');
    if (existsSync(runtime)) {
      const cleaner = await createSandboxDriver({ stateDir: runtime });
      for (const d of await cleaner.list()) await cleaner.destroy(d.desktopId);
      await cleaner.close();
    }
    rmSync(dataDir, { recursive: true, force: true });
    rmSync(scratch, { recursive: true, force: true });
  }, STOP_DEADLINE_MS + 60_000);

  it('runs every shell snippet, and each does what its comments say', async () => {
    const snippets = shellSnippets(readFileSync(join(ROOT, 'README.md'), 'utf8'));
    expect(snippets.map((s) => `block ${s.block}`), 'one entry of PROMISES per runnable README snippet').toHaveLength(PROMISES.length);

    const port = await freePort();
    const ingressPort = await freePort();
    const up = spawn(process.execPath, [CLI, 'up', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`], {
      env: {
        PATH: process.env.PATH,
        HOME: '/root',
        CANTO_LOG_LEVEL: 'warn',
        // Ports of its own, so the `canto up`s of other test files never collide with this one.
        CANTO_INGRESS_LISTEN: `127.0.0.1:${ingressPort}`,
        CANTO_INGRESS_BASE_URL: `http://localhost:${ingressPort}`,
        CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(up);
    let banner = '';
    up.stdout.on('data', (d: Buffer) => (banner += d.toString()));
    up.stderr.on('data', (d: Buffer) => (banner += d.toString()));
    await until(() => {
      if (up.exitCode !== null) throw new Error(`canto up exited ${up.exitCode}:\n${banner}`);
      return banner.includes('Press Ctrl-C');
    }, 90_000, 'canto up');
    const instance: Instance = {
      api: /API:\s+(\S+)/.exec(banner)![1]!,
      key: /API key:\s+(svc_sk_\S+)/.exec(banner)![1]!,
      dataDir,
    };
    const values = { KEY: instance.key, API: instance.api, DATABASE_URL: `postgres://canto@localhost/canto?host=${dataDir}/postgres/run` };

    symlinkSync(join(ROOT, 'dist'), join(scratch, 'dist'));
    mkdirSync(join(scratch, '.curl'));
    writeFileSync(join(scratch, '.curl', '.curlrc'), 'fail-with-body\nshow-error\n');
    const script = [
      'set -euo pipefail',
      'exec 2>&1',
      ...snippets.flatMap((s, i) => [`printf '\\n${MARK} ${i}\\n'`, withInstance(s, values)]),
      `printf '\\n${MARK} done\\n'`,
    ].join('\n');
    writeFileSync(join(scratch, 'readme.sh'), script);

    const bash = spawn('bash', ['readme.sh'], {
      cwd: scratch,
      env: { PATH: process.env.PATH, HOME: '/root', LANG: 'C.UTF-8', CURL_HOME: join(scratch, '.curl') },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(bash);
    let output = '';
    bash.stdout.on('data', (d: Buffer) => (output += d.toString()));
    bash.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const timer = setTimeout(() => crashTree(bash.pid!), RUN_DEADLINE_MS);
    const code = await new Promise<number | null>((resolve) => bash.once('exit', (c) => resolve(c)));
    clearTimeout(timer);

    // Output of snippet i is what comes between its mark and the next one.
    const parts = output.split(new RegExp(`\\n${MARK} (\\d+|done)\\n`));
    const outputs = new Map<number, string>();
    let last = -1;
    for (let p = 1; p < parts.length; p += 2) {
      if (parts[p] === 'done') continue;
      last = Number(parts[p]);
      outputs.set(last, parts[p + 1] ?? '');
    }
    const report = (i: number, why: string) => {
      const s = snippets[i]!;
      return `README snippet ${i + 1} (block ${s.block}, line ${s.line}: ${PROMISES[i]?.about}) ${why}\n` +
        `--- snippet ---\n${s.text}\n--- output ---\n${outputs.get(i) ?? output}\n`;
    };
    if (code !== 0 || !output.includes(`${MARK} done`)) {
      const why = code === null ? `did not finish within ${RUN_DEADLINE_MS / 1000} s` : `exited ${code}`;
      throw new Error(last < 0 ? `the README run ${why} before its first snippet:\n${output}` : report(last, why));
    }

    for (const [i, promise] of PROMISES.entries()) {
      const out = outputs.get(i) ?? '';
      for (const shows of promise.shows) expect(out, report(i, `does not show ${shows}`)).toMatch(shows);
      await promise.check?.(out, scratch, instance);
    }
  }, RUN_DEADLINE_MS + 120_000);
});
