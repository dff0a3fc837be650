/**
 * Guest operations through the HTTP API (docs/api.md §4.3, 4.4) against a real awake sandbox desktop: the
 * real scheduler and a real agent in-process, the sandbox runtime, a real PostgreSQL. Every rule
 * of exec, detached processes and files is exercised here over real sockets, including the
 * confinement of guest paths (symlinks planted in the guest must never reach a host file), atomic
 * writes under a cut connection, and a 20 MiB file moved in 8 MiB chunks.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

const isRoot = process.getuid?.() === 0;
const MiB = 1024 * 1024;

const sha256 = (data: Uint8Array) => createHash('sha256').update(data).digest('hex');

describe.skipIf(!isRoot)('guest operations through the API, on a real sandbox desktop', () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let key: string;
  let call: ReturnType<typeof api>;
  let other: ReturnType<typeof api>;
  let id: string;

  /** Raw request with a binary body; answers status, headers and the body as bytes. */
  async function raw(method: string, path: string, body?: Uint8Array, headers: Record<string, string> = {}) {
    const res = await fetch(scheduler.url + path, {
      method,
      headers: { authorization: `Bearer ${key}`, ...headers },
      body,
    });
    const bytes = Buffer.from(await res.arrayBuffer());
    let json: any = null;
    try {
      json = JSON.parse(bytes.toString());
    } catch {
      json = null;
    }
    return { status: res.status, headers: res.headers, bytes, text: bytes.toString(), json };
  }

  /** A request whose path goes on the wire exactly as written. */
  function literalPath(method: string, path: string): Promise<{ status: number; body: string }> {
    const url = new URL(scheduler.url);
    return new Promise((resolve, reject) => {
      const req = httpRequest({ host: url.hostname, port: url.port, method, path, headers: { authorization: `Bearer ${key}` } }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on('error', reject);
      req.end();
    });
  }

  const exec = async (command: string, extra: Record<string, unknown> = {}) => {
    const res = await call('POST', `/v1/desktops/${id}/exec`, { command, ...extra });
    return res;
  };

  async function createAwake(body: Record<string, unknown> = { tier: 'small' }): Promise<string> {
    const created = await call('POST', '/v1/desktops', body);
    expect(created.status, created.text).toBe(201);
    const woke = await call('POST', `/v1/desktops/${created.json.id}/wake?wait=true`);
    expect(woke.status, woke.text).toBe(200);
    expect(woke.json.state).toBe('succeeded');
    return created.json.id;
  }

  beforeAll(async () => {
    scheduler = await startTestScheduler({ CANTO_OPERATION_DEADLINE_MS: '60000' });
    agent = await startSandboxAgent(scheduler.url);
    key = await mintKey(scheduler.databaseUrl, 'guest-ops');
    call = api(scheduler.url, key);
    other = api(scheduler.url, await mintKey(scheduler.databaseUrl, 'someone-else'));
    id = await createAwake({ tier: 'small', env: { GREETING: "hello 'guest'" }, setup_script: 'echo set up; exit 3' });
  }, 120_000);

  afterAll(async () => {
    await agent?.stop();
    await scheduler?.close();
  }, 120_000);

  describe('exec', () => {
    it('runs a command as root inside the desktop, with the env file applied', async () => {
      const res = await exec('echo "$GREETING"; id -u; hostname; echo oops >&2; exit 3');
      expect(res.status, res.text).toBe(200);
      expect(res.json).toEqual({
        exit_code: 3,
        stdout: `hello 'guest'\n0\n${id.replace(/_/g, '-')}\n`,
        stderr: 'oops\n',
        stdout_truncated: false,
        stderr_truncated: false,
      });
    });

    it('keeps the first 1 MiB of each output stream and says it dropped the rest', async () => {
      const res = await exec("head -c 1500000 /dev/zero | tr '\\0' a; echo small >&2");
      expect(res.status, res.text).toBe(200);
      expect(res.json.stdout).toBe('a'.repeat(MiB));
      expect(res.json.stdout_truncated).toBe(true);
      expect(res.json.stderr).toBe('small\n');
      expect(res.json.stderr_truncated).toBe(false);
    });

    it('answers 504 when the guest deadline passes, and clamps timeout_secs instead of rejecting it', async () => {
      expectProblem(await exec('sleep 30', { timeout_secs: 1 }), 504, 'sleep past the deadline');
      for (const timeout_secs of [null, 0, -5, 0.2, 100_000]) {
        const res = await exec('echo fine', { timeout_secs });
        expect(res.status, `timeout_secs ${timeout_secs}: ${res.text}`).toBe(200);
        expect(res.json.stdout).toBe('fine\n');
      }
    });

    it('refuses an empty or malformed command with 400', async () => {
      expectProblem(await exec(''), 400, 'empty');
      expectProblem(await exec('   '), 400, 'blank');
      expectProblem(await call('POST', `/v1/desktops/${id}/exec`, {}), 400, 'missing');
      expectProblem(await call('POST', `/v1/desktops/${id}/exec`, { command: 42 }), 400, 'not a string');
      expectProblem(await call('POST', `/v1/desktops/${id}/exec`, '{"command":'), 400, 'malformed JSON');
      expectProblem(await call('POST', `/v1/desktops/${id}/exec`, { command: 'true', detached: 'yes' }), 400, 'detached not boolean');
      expectProblem(await call('POST', '/v1/desktops/dsk_nope/exec', { command: 'true' }), 400, 'malformed id');
    });

    it('answers 404 for a missing desktop and, identically, for another org\u2019s', async () => {
      const missing = await call('POST', `/v1/desktops/${newId('desktop')}/exec`, { command: 'true' });
      const foreign = await other('POST', `/v1/desktops/${id}/exec`, { command: 'true' });
      expectProblem(missing, 404);
      expect(foreign.status).toBe(404);
      expect(foreign.text).toBe(missing.text);
      const foreignFile = await other('GET', `/v1/desktops/${id}/files/root/.canto/env`);
      expect(foreignFile.status).toBe(404);
    });
  });

  describe('detached processes', () => {
    it('starts a detached process and reports running, then exited with its code and output tails', async () => {
      const started = await exec('echo begun; sleep 1; echo out; echo err >&2; exit 4', { detached: true, timeout_secs: 1 });
      expect(started.status, started.text).toBe(202);
      expect(started.json.process_id).toMatch(/^prc_[0-9a-v]{24}$/);
      const path = `/v1/desktops/${id}/processes/${started.json.process_id}`;
      const first = await call('GET', path);
      expect(first.status, first.text).toBe(200);
      expect(first.json.status).toBe('running');
      expect(first.json.exit_code).toBe(-1);
      const done = await until(async () => {
        const res = await call('GET', path);
        return res.json.status === 'exited' ? res : null;
      }, 15_000, 'the detached process to exit');
      expect(done.json).toEqual({ process_id: started.json.process_id, status: 'exited', exit_code: 4, stdout_tail: 'begun\nout\n', stderr_tail: 'err\n' });
    });

    it('reports the first-boot setup script under process id setup', async () => {
      const res = await until(async () => {
        const r = await call('GET', `/v1/desktops/${id}/processes/setup`);
        return r.json?.status === 'exited' ? r : null;
      }, 15_000, 'setup to finish');
      expect(res.json).toMatchObject({ process_id: 'setup', exit_code: 3, stdout_tail: 'set up\n' });
    });

    it('returns tail_bytes of output: 64 KiB by default and for 0, at most 512 KiB', async () => {
      const started = await exec("head -c 600000 /dev/zero | tr '\\0' b", { detached: true });
      const path = `/v1/desktops/${id}/processes/${started.json.process_id}`;
      await until(async () => (await call('GET', path)).json.status === 'exited', 15_000, 'output to be written');
      expect((await call('GET', `${path}?tail_bytes=10`)).json.stdout_tail).toBe('b'.repeat(10));
      expect((await call('GET', path)).json.stdout_tail).toHaveLength(64 * 1024);
      expect((await call('GET', `${path}?tail_bytes=0`)).json.stdout_tail).toHaveLength(64 * 1024);
      expect((await call('GET', `${path}?tail_bytes=99999999`)).json.stdout_tail).toHaveLength(512 * 1024);
      expectProblem(await call('GET', `${path}?tail_bytes=abc`), 400, 'non-numeric');
      expectProblem(await call('GET', `${path}?tail_bytes=-1`), 400, 'negative');
    });

    it('answers 404 for an unknown process id and 400 for a malformed one', async () => {
      expectProblem(await call('GET', `/v1/desktops/${id}/processes/${newId('process')}`), 404, 'unknown');
      expectProblem(await call('GET', `/v1/desktops/${id}/processes/bogus`), 400, 'malformed');
      expectProblem(await call('GET', `/v1/desktops/${id}/processes/..%2F..%2Fetc`), 400, 'traversal');
    });
  });

  describe('files', () => {
    const file = (path: string, query = '') => `/v1/desktops/${id}/files/${path}${query}`;

    it('writes (replacing) and reads a whole file, creating missing parents', async () => {
      expect((await raw('PUT', file('root/notes/a/hello.txt'), Buffer.from('hello world'))).status).toBe(204);
      expect((await raw('PUT', file('root/notes/a/hello.txt'), Buffer.from('hello'))).status).toBe(204);
      const read = await raw('GET', file('root/notes/a/hello.txt'));
      expect(read.status).toBe(200);
      expect(read.headers.get('content-type')).toBe('application/octet-stream');
      expect(read.text).toBe('hello');
      // Any content type is bytes: curl --data-binary labels its body as a form.
      const form = await raw('PUT', file('root/form.bin'), Buffer.from('a=b&c'), { 'content-type': 'application/x-www-form-urlencoded' });
      expect(form.status, form.text).toBe(204);
      expect((await raw('GET', file('root/form.bin'))).text).toBe('a=b&c');
      expect((await raw('PUT', file('root/empty'))).status).toBe(204);
      expect((await raw('GET', file('root/empty'))).bytes.length).toBe(0);
      // Written inside the guest: the desktop's own shell sees it.
      expect((await exec('cat /root/notes/a/hello.txt')).json.stdout).toBe('hello');
    });

    it('reads windows with X-Svc-File-Size and X-Svc-Eof, and an empty body at or past EOF', async () => {
      const w = await raw('GET', file('root/notes/a/hello.txt', '?offset=1&length=3'));
      expect(w.text).toBe('ell');
      expect(w.headers.get('x-svc-file-size')).toBe('5');
      expect(w.headers.get('x-svc-eof')).toBe('false');
      const rest = await raw('GET', file('root/notes/a/hello.txt', '?offset=3'));
      expect(rest.text).toBe('lo');
      expect(rest.headers.get('x-svc-eof')).toBe('true');
      for (const offset of [5, 1000]) {
        const past = await raw('GET', file('root/notes/a/hello.txt', `?offset=${offset}`));
        expect(past.status).toBe(200);
        expect(past.bytes.length).toBe(0);
        expect(past.headers.get('x-svc-eof')).toBe('true');
        expect(past.headers.get('x-svc-file-size')).toBe('5');
      }
    });

    it('checks read parameters: 400 for length without offset, non-numeric, or over 8 MiB; 413 for a whole read over 8 MiB', async () => {
      expectProblem(await call('GET', file('root/notes/a/hello.txt', '?length=2')), 400, 'length without offset');
      expectProblem(await call('GET', file('root/notes/a/hello.txt', '?offset=x')), 400, 'offset not numeric');
      expectProblem(await call('GET', file('root/notes/a/hello.txt', '?offset=0&length=1e3')), 400, 'length not an integer');
      expectProblem(await call('GET', file('root/notes/a/hello.txt', `?offset=0&length=${8 * MiB + 1}`)), 400, 'length over 8 MiB');
      expect((await exec(`head -c ${8 * MiB + 1} /dev/zero > /root/big.bin`)).json.exit_code).toBe(0);
      expectProblem(await call('GET', file('root/big.bin')), 413, 'whole read over 8 MiB');
      const window = await raw('GET', file('root/big.bin', `?offset=${8 * MiB - 1}`));
      expect(window.bytes.length).toBe(2);
      expect(window.headers.get('x-svc-eof')).toBe('true');
      expectProblem(await call('GET', file('root/missing.txt')), 404, 'missing file');
      expectProblem(await call('GET', file('root/notes')), 409, 'a directory');
    });

    it('moves a 20 MiB file in 8 MiB chunks with append and reads it back byte-identical', async () => {
      const data = Buffer.alloc(20 * MiB);
      for (let i = 0; i < data.length; i += 4) data.writeUInt32LE((i * 2654435761) >>> 0, i);
      const chunk = 8 * MiB;
      for (let offset = 0; offset < data.length; offset += chunk) {
        const res = await raw('PUT', file('root/big/twenty.bin', `?append=true&offset=${offset}`), data.subarray(offset, offset + chunk));
        expect(res.status, res.text).toBe(204);
      }
      const parts: Buffer[] = [];
      for (let offset = 0, eof = false; !eof; offset += chunk) {
        const res = await raw('GET', file('root/big/twenty.bin', `?offset=${offset}&length=${chunk}`));
        expect(res.status).toBe(200);
        expect(res.headers.get('x-svc-file-size')).toBe(String(data.length));
        eof = res.headers.get('x-svc-eof') === 'true';
        parts.push(res.bytes);
      }
      expect(sha256(Buffer.concat(parts))).toBe(sha256(data));
      const meta = await call('GET', `/v1/desktops/${id}/files-meta/root/big/twenty.bin`);
      expect(meta.json.sizeBytes).toBe(data.length);
    });

    it('guards appends: 409 with currentSize when the size differs, 400 without offset', async () => {
      expect((await raw('PUT', file('root/log.txt', '?append=true&offset=0'), Buffer.from('one\n'))).status).toBe(204);
      const stale = await raw('PUT', file('root/log.txt', '?append=true&offset=0'), Buffer.from('one\n'));
      expectProblem(stale, 409, 'retried chunk');
      expect(stale.json.currentSize).toBe(4);
      expect((await raw('PUT', file('root/log.txt', '?append=true&offset=4'), Buffer.from('two\n'))).status).toBe(204);
      expect((await raw('GET', file('root/log.txt'))).text).toBe('one\ntwo\n');
      const ahead = await raw('PUT', file('root/fresh.txt', '?append=true&offset=3'), Buffer.from('x'));
      expect(ahead.status).toBe(409);
      expect(ahead.json.currentSize).toBe(0);
      expectProblem(await call('PUT', file('root/log.txt', '?append=true'), 'x'), 400, 'append without offset');
      expectProblem(await call('PUT', file('root/log.txt', '?append=yes&offset=0'), 'x'), 400, 'append not boolean');
    });

    it('refuses a body over 8 MiB with 413 and leaves the file as it was', async () => {
      expect((await raw('PUT', file('root/keep.txt'), Buffer.from('original'))).status).toBe(204);
      expectProblem(await raw('PUT', file('root/keep.txt'), Buffer.alloc(8 * MiB + 1)), 413, 'declared length');
      // Without a Content-Length the cap is enforced while counting.
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          for (let i = 0; i < 9; i++) controller.enqueue(new Uint8Array(MiB));
          controller.close();
        },
      });
      const res = await fetch(scheduler.url + file('root/keep.txt'), {
        method: 'PUT',
        headers: { authorization: `Bearer ${key}` },
        body: stream,
        duplex: 'half',
      } as RequestInit);
      expect(res.status).toBe(413);
      await res.arrayBuffer();
      expect((await raw('GET', file('root/keep.txt'))).text).toBe('original');
    });

    it('keeps the old content when an upload is cut midway, and leaves no temporary file', async () => {
      expect((await raw('PUT', file('root/atomic/doc.txt'), Buffer.from('old content'))).status).toBe(204);
      await new Promise<void>((resolve) => {
        const url = new URL(scheduler.url + file('root/atomic/doc.txt'));
        const req = httpRequest(url, {
          method: 'PUT',
          headers: { authorization: `Bearer ${key}`, 'content-length': String(4 * MiB) },
        });
        req.on('error', () => resolve());
        req.on('close', () => resolve());
        req.write(Buffer.alloc(MiB, 1), () => setTimeout(() => req.destroy(), 200));
      });
      // The agent discards the partial upload; wait until it has, then check nothing changed.
      await until(async () => {
        const list = await call('GET', `/v1/desktops/${id}/dir/root/atomic`);
        return list.json.entries.length === 1;
      }, 10_000, 'the partial upload to be discarded');
      expect((await raw('GET', file('root/atomic/doc.txt'))).text).toBe('old content');
      const list = await call('GET', `/v1/desktops/${id}/dir/root/atomic`);
      expect(list.json.entries.map((e: { name: string }) => e.name)).toEqual(['doc.txt']);
    });

    it('deletes files and trees by the rules: 404 the second time, 409 for a directory without recursive, root refused', async () => {
      expect((await raw('PUT', file('root/trash/sub/x.txt'), Buffer.from('x'))).status).toBe(204);
      expect((await raw('DELETE', file('root/trash/sub/x.txt'))).status).toBe(204);
      expectProblem(await call('DELETE', file('root/trash/sub/x.txt')), 404, 'second delete');
      expectProblem(await call('DELETE', file('root/trash/sub')), 409, 'empty directory without recursive');
      expect((await raw('PUT', file('root/trash/sub/y.txt'), Buffer.from('y'))).status).toBe(204);
      expectProblem(await call('DELETE', file('root/trash', '?recursive=false')), 409, 'recursive=false');
      expect((await raw('DELETE', file('root/trash', '?recursive=true'))).status).toBe(204);
      expectProblem(await call('GET', `/v1/desktops/${id}/files-meta/root/trash`), 404, 'gone');
      expectProblem(await call('DELETE', file('.')), 400, 'root as .');
      expectProblem(await call('DELETE', file('/')), 400, 'root as /');
      expectProblem(await call('DELETE', file('./.', '?recursive=true')), 400, 'root as ./.');
      expectProblem(await call('DELETE', file('root/x', '?recursive=maybe')), 400, 'recursive not boolean');
    });

    it('stats files, directories and symlinks without following the link', async () => {
      await exec('mkdir -p /root/st && printf 12345 > /root/st/f && chmod 640 /root/st/f && ln -sfn /etc /root/st/link');
      const f = await call('GET', `/v1/desktops/${id}/files-meta/root/st/f`);
      expect(f.status, f.text).toBe(200);
      expect(f.json).toMatchObject({ path: 'root/st/f', fileType: 'file', sizeBytes: 5, mode: '640' });
      expect(Math.abs(Date.parse(f.json.modifiedAt) - Date.now())).toBeLessThan(60_000);
      const d = await call('GET', `/v1/desktops/${id}/files-meta/root/st`);
      expect(d.json).toMatchObject({ path: 'root/st', fileType: 'directory' });
      const l = await call('GET', `/v1/desktops/${id}/files-meta/root/st/link`);
      expect(l.json).toMatchObject({ path: 'root/st/link', fileType: 'symlink' });
      const tmp = await call('GET', `/v1/desktops/${id}/files-meta/tmp`);
      expect(tmp.json.mode).toBe('1777');
      expectProblem(await call('GET', `/v1/desktops/${id}/files-meta/root/st/nope`), 404, 'missing');
    });

    it('lists direct children in byte order, the root as dir/, and at most 2000 entries', async () => {
      await exec('mkdir -p /root/ls && cd /root/ls && touch a B _ Z 0 && mkdir sub && ln -s a link');
      const list = await call('GET', `/v1/desktops/${id}/dir/root/ls`);
      expect(list.status, list.text).toBe(200);
      expect(list.json.path).toBe('root/ls');
      expect(list.json.truncated).toBe(false);
      expect(list.json.entries.map((e: { name: string }) => e.name)).toEqual(['0', 'B', 'Z', '_', 'a', 'link', 'sub']);
      const types = Object.fromEntries(list.json.entries.map((e: { name: string; fileType: string }) => [e.name, e.fileType]));
      expect(types).toMatchObject({ a: 'file', sub: 'directory', link: 'symlink' });
      const root = await call('GET', `/v1/desktops/${id}/dir/`);
      expect(root.json.path).toBe('');
      expect(root.json.entries.map((e: { name: string }) => e.name)).toEqual(expect.arrayContaining(['root', 'tmp', 'usr', 'etc']));
      await exec('mkdir -p /root/many && cd /root/many && seq -w 1 2100 | xargs touch');
      const many = await call('GET', `/v1/desktops/${id}/dir/root/many`);
      expect(many.json.entries).toHaveLength(2000);
      expect(many.json.truncated).toBe(true);
      expect(many.json.entries[0].name).toBe('0001');
      expect(many.json.entries[1999].name).toBe('2000');
      expectProblem(await call('GET', `/v1/desktops/${id}/dir/root/ls/a`), 409, 'not a directory');
      expectProblem(await call('GET', `/v1/desktops/${id}/dir/root/nope`), 404, 'missing');
    });

    it('refuses empty, NUL and .. paths with 400 on every route', async () => {
      const routes = [
        ['GET', 'files'],
        ['PUT', 'files'],
        ['DELETE', 'files'],
        ['GET', 'files-meta'],
        ['GET', 'dir'],
      ] as const;
      for (const [method, route] of routes) {
        const base = `/v1/desktops/${id}/${route}/`;
        if (route !== 'dir') expectProblem(await call(method, base), 400, `${method} ${route} empty`);
        expectProblem(await call(method, `${base}root/a%00b`), 400, `${method} ${route} NUL`);
        expectProblem(await call(method, `${base}root/..%2F..%2Fetc`), 400, `${method} ${route} encoded ..`);
        // fetch normalizes a literal `..` away, as browsers do; a raw client can still send one.
        const literal = await literalPath(method, `${base}root/x/../../etc/passwd`);
        expect(literal.status, `${method} ${route} literal ..`).toBe(400);
        expect(literal.body).toContain('..');
      }
    });
  });

  describe('confinement', () => {
    let hostDir: string;
    let hostSecret: string;

    beforeAll(async () => {
      // A host file the guest has no business seeing, at a path that does not exist in the guest.
      hostDir = join(agent.stateDir, 'host-only');
      mkdirSync(hostDir, { recursive: true });
      hostSecret = join(hostDir, 'secret.txt');
      writeFileSync(hostSecret, 'host secret');
      const links = ['ln -sfn / /root/to-root', 'ln -sfn /etc/shadow /root/to-shadow', 'ln -sfn /proc/1/root /root/to-proc', 'ln -sfn ../../../../../../.. /root/to-up', `ln -sfn ${hostDir} /root/to-hostdir`];
      expect((await exec(links.join(' && '))).json.exit_code).toBe(0);
    });

    const hostRel = () => hostSecret.slice(1);

    it('never reads, stats or lists a host file through guest symlinks', async () => {
      for (const link of ['to-root', 'to-proc', 'to-up']) {
        expectProblem(await call('GET', `/v1/desktops/${id}/files/root/${link}/${hostRel()}`), 404, `read via ${link}`);
        expectProblem(await call('GET', `/v1/desktops/${id}/files-meta/root/${link}/${hostRel()}`), 404, `stat via ${link}`);
        expectProblem(await call('GET', `/v1/desktops/${id}/dir/root/${link}/${hostDir.slice(1)}`), 404, `list via ${link}`);
      }
      expectProblem(await call('GET', `/v1/desktops/${id}/files/root/to-hostdir/secret.txt`), 404, 'read via a link to the host dir');
      expectProblem(await call('GET', `/v1/desktops/${id}/dir/root/to-hostdir`), 404, 'list via a link to the host dir');
      // The guest's /etc/shadow is the mask (a bind of /dev/null, not a regular file), never the host's.
      const shadow = await raw('GET', `/v1/desktops/${id}/files/root/to-shadow`);
      expectProblem(shadow, 409, 'read of the masked /etc/shadow');
      expect(shadow.text).not.toContain('root:');
      // The link to / lists the guest's root, which has no host-only directories.
      const viaRoot = await call('GET', `/v1/desktops/${id}/dir/root/to-proc`);
      expect(viaRoot.status).toBe(200);
      expect(viaRoot.json.entries.map((e: { name: string }) => e.name)).toContain('root');
    });

    it('never writes or deletes a host file through guest symlinks', async () => {
      const shadowBefore = sha256(readFileSync('/etc/shadow'));
      for (const link of ['to-root', 'to-proc', 'to-up']) {
        // The path exists nowhere in the guest, whose /tmp is its own: the write lands there,
        // parents created, and the delete removes that guest copy.
        const target = `/v1/desktops/${id}/files/root/${link}/${hostRel()}`;
        const put = await raw('PUT', target, Buffer.from('pwned'));
        expect(put.status, put.text).toBe(204);
        expect((await raw('GET', target)).text).toBe('pwned');
        expect(readFileSync(hostSecret, 'utf8')).toBe('host secret');
        expect((await raw('DELETE', target)).status).toBe(204);
        expect(readFileSync(hostSecret, 'utf8')).toBe('host secret');
      }
      // A link to the host directory's path dangles in the guest: the write creates that path in
      // the guest's own /tmp, and the delete removes the guest's copy.
      const viaDir = `/v1/desktops/${id}/files/root/to-hostdir/secret.txt`;
      expect((await raw('PUT', viaDir, Buffer.from('pwned'))).status).toBe(204);
      expect((await raw('GET', viaDir)).text).toBe('pwned');
      expect((await raw('DELETE', viaDir)).status).toBe(204);
      expectProblem(await raw('PUT', `/v1/desktops/${id}/files/root/to-shadow`, Buffer.from('root::0:0:99999:7:::\n')), 409, 'write to /etc/shadow');
      expectProblem(await raw('PUT', `/v1/desktops/${id}/files/usr/bin/canto-planted`, Buffer.from('x')), 409, 'write under read-only /usr');
      expect(readFileSync(hostSecret, 'utf8')).toBe('host secret');
      expect(readdirSync(hostDir)).toEqual(['secret.txt']);
      expect(sha256(readFileSync('/etc/shadow'))).toBe(shadowBefore);
      expect(existsSync('/usr/bin/canto-planted')).toBe(false);
    });
  });

  describe('display', () => {
    it('reads the live geometry and resizes it, read back from the X server', async () => {
      expect((await call('GET', `/v1/desktops/${id}/display`)).json).toEqual({ width: 1024, height: 768 });
      const put = await call('PUT', `/v1/desktops/${id}/display`, { width: 1280, height: 800 });
      expect(put.status, put.text).toBe(200);
      expect(put.json).toEqual({ width: 1280, height: 800 });
      // The guest's own X clients see the new size.
      expect((await exec('xdpyinfo 2>/dev/null | grep dimensions || xrandr --current | head -1')).json.stdout).toMatch(/1280 ?x ?800/);
      expect((await call('GET', `/v1/desktops/${id}/display`)).json).toEqual({ width: 1280, height: 800 });
      expectProblem(await call('PUT', `/v1/desktops/${id}/display`, { width: 4000, height: 800 }), 400, 'too wide');
    });
  });

  describe('state and reachability', () => {
    it('kills detached processes on hibernate (they read lost after wake) and answers 409 while not awake', async () => {
      expect((await call('PUT', `/v1/desktops/${id}/display`, { width: 1600, height: 900 })).status).toBe(200);
      const started = await exec('sleep 1000', { detached: true });
      const path = `/v1/desktops/${id}/processes/${started.json.process_id}`;
      expect((await call('GET', path)).json.status).toBe('running');
      const hibernated = await call('POST', `/v1/desktops/${id}/hibernate?wait=true`);
      expect(hibernated.status, hibernated.text).toBe(200);
      for (const [method, route] of [['POST', 'exec'], ['GET', 'files/root/log.txt'], ['GET', 'dir/root'], ['GET', 'files-meta/root'], ['DELETE', 'files/root/log.txt'], ['GET', `processes/${started.json.process_id}`]] as const) {
        const res = method === 'POST' ? await call(method, `/v1/desktops/${id}/${route}`, { command: 'true' }) : await call(method, `/v1/desktops/${id}/${route}`);
        expectProblem(res, 409, `${method} ${route} while hibernated`);
      }
      expectProblem(await raw('PUT', `/v1/desktops/${id}/files/root/log.txt`, Buffer.from('x')), 409, 'write while hibernated');
      const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
      expect(woke.status, woke.text).toBe(200);
      const after = await call('GET', path);
      expect(after.json).toMatchObject({ status: 'lost', exit_code: -1 });
      // The display geometry survives: a memory snapshot keeps it, a cold boot sets it again.
      expect((await call('GET', `/v1/desktops/${id}/display`)).json).toEqual({ width: 1600, height: 900 });
      // Files survive hibernation.
      expect((await raw('GET', `/v1/desktops/${id}/files/root/log.txt`)).text).toBe('one\ntwo\n');
    }, 60_000);

    it('answers 503 at once while the host is unreachable, and works again once its agent is back', async () => {
      await agent.halt();
      await until(async () => !scheduler.agents.isConnected(agent.hostId), 5_000, 'the link to close');
      const t0 = performance.now();
      const res = await exec('true');
      const elapsed = performance.now() - t0;
      expectProblem(res, 503, 'exec with the host down');
      expect(res.headers.get('retry-after')).toBeTruthy();
      expect(elapsed).toBeLessThan(2_000);
      expectProblem(await call('GET', `/v1/desktops/${id}/files/root/log.txt`), 503, 'read with the host down');
      agent = await startSandboxAgent(scheduler.url, agent.stateDir);
      const back = await exec('cat /root/log.txt');
      expect(back.status, back.text).toBe(200);
      expect(back.json.stdout).toBe('one\ntwo\n');
    }, 60_000);
  });
});
