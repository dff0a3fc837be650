/**
 * Files through the HTTP API (docs/api.md §4.4) against a real awake sandbox desktop: the real
 * scheduler and a real agent in-process, the sandbox runtime, a real PostgreSQL. Every rule of
 * reads, writes, appends and deletes over real sockets, including the confinement of guest paths
 * (symlinks planted in the guest must never reach a host file), atomic writes under a cut
 * connection, and a 20 MiB file moved in 8 MiB chunks. The world is
 * test/helpers/guest-api-world.ts.
 */
import { mkdirSync, readFileSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { until } from '../helpers/scheduler.js';
import { expectProblem } from '../helpers/problem.js';
import {
  call, exec, id, isRoot, key, literalPath, MiB, raw, scheduler, agent, sha256, useAwakeDesktop,
} from '../helpers/guest-api-world.js';

describe.skipIf(!isRoot)('files through the API, on a real sandbox desktop', () => {
  useAwakeDesktop();

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
      // Any int64 offset, however far past what a disk can hold: the contract types it int64.
      for (const offset of ['5', '1000', '9007199254740993', '9223372036854775807']) {
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
      expectProblem(await call('GET', file('root/notes/a/hello.txt', '?offset=0&length=9223372036854775807')), 400, 'length over 8 MiB');
      expectProblem(await call('GET', file('root/notes/a/hello.txt', '?offset=9223372036854775808')), 400, 'offset beyond int64');
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

    it('replaces an 8 MiB file and reads it back whole and in an odd window, byte-identical', async () => {
      for (const seed of [1, 2]) {
        const data = Buffer.alloc(8 * MiB);
        for (let i = 0; i < data.length; i += 4) data.writeUInt32LE((i * 2654435761 + seed) >>> 0, i);
        const put = await raw('PUT', file('root/big/eight.bin'), data);
        expect(put.status, put.text).toBe(204);
        const whole = await raw('GET', file('root/big/eight.bin'));
        expect(whole.status).toBe(200);
        expect(sha256(whole.bytes), `seed ${seed}`).toBe(sha256(data));
        const [from, length] = [3 * MiB + 7, 4 * MiB + 1];
        const window = await raw('GET', file('root/big/eight.bin', `?offset=${from}&length=${length}`));
        expect(window.headers.get('x-svc-eof')).toBe('false');
        expect(sha256(window.bytes)).toBe(sha256(data.subarray(from, from + length)));
      }
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
      const far = await raw('PUT', file('root/log.txt', '?append=true&offset=9223372036854775807'), Buffer.from('x'));
      expectProblem(far, 409, 'append far past the end');
      expect(far.json.currentSize).toBe(8);
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
});
