/**
 * File operations of the sandbox driver against the real machine: stat, list, read, write,
 * append and delete inside a real desktop, and the rules that keep them confined to the guest
 * (symlinks planted in the guest never reach a host file). Needs root. The desktop and its
 * helpers are test/helpers/sandbox-guest-world.ts; detached processes, exec and hibernate are in
 * sandbox-guest-ops.test.ts.
 */
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { readdir, readFile, stat } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import type { AgentFailure } from '../../shared/src/protocol.js';
import { guestHelperProgram, type HelperOp } from '../../agent/src/runtime/sandbox/guest/guest-helper.js';
import { until } from '../helpers/scheduler.js';
import { failure } from '../helpers/agent-failure.js';
import { drain, isRoot, sha256 } from '../helpers/sandbox.js';
import {
  append, driver, stateDir, GUEST_ROOT_NAMES, hostDir, hostPidsWithArgs, id, MiB, put, read, sentinel, sh, stopped, text, timed,
  useGuestDesktop,
} from '../helpers/sandbox-guest-world.js';

const execFileAsync = promisify(execFile);

if (!isRoot) console.warn('sandbox guest-ops tests skipped: they need root (namespaces, cgroups, CRIU)');

describe.skipIf(!isRoot)('sandbox driver file operations', () => {
  useGuestDesktop();

  it('the helper programs compile under strict', async () => {
    const ops: HelperOp[] = ['stat', 'list', 'read', 'write', 'delete', 'spawn', 'status', 'kill-detached'];
    for (const op of ops) {
      const { stderr } = await execFileAsync('perl', ['-Mstrict', '-w', '-c', '-e', guestHelperProgram(op)]);
      expect(stderr.trim(), op).toBe('-e syntax OK');
    }
  });

  it('refuses malformed paths, unknown and stopped desktops', async () => {
    for (const path of ['root/x', '/root/../etc', '/root//x', '/root/', '/root/./x', '/a\0b', '']) {
      expect((await failure(driver.statPath(id, path))).code, JSON.stringify(path)).toBe('bad_request');
      expect((await failure(put(path, 'x'))).code, JSON.stringify(path)).toBe('bad_request');
    }
    expect((await failure(driver.deletePath(id, '/', true))).code).toBe('bad_request');
    expect((await failure(driver.statPath(newId('desktop'), '/root'))).code).toBe('not_found');
    expect((await failure(driver.statPath(stopped, '/root'))).code).toBe('not_running');
    expect((await failure(driver.listDir(stopped, '/', 10))).code).toBe('not_running');
    expect((await failure(driver.processStatus(stopped, 'setup', 10))).code).toBe('not_running');
  });

  it('stats files, directories, symlinks and others with their permission bits', async () => {
    await sh(
      'mkdir -p /root/st && cd /root/st && printf 12345 > f && chmod 640 f && ' +
        "touch -d '2021-02-03T04:05:06.789Z' f && ln -s f link && mkfifo fifo && touch su && chmod 4755 su",
    );
    expect(await timed('stat', () => driver.statPath(id, '/root/st/f'))).toEqual({
      fileType: 'file', sizeBytes: 5, modifiedAt: '2021-02-03T04:05:06.789Z', mode: '640',
    });
    expect(await driver.statPath(id, '/root/st/link')).toMatchObject({ fileType: 'symlink', sizeBytes: 1 });
    expect(await driver.statPath(id, '/root/st/fifo')).toMatchObject({ fileType: 'other' });
    expect(await driver.statPath(id, '/root/st/su')).toMatchObject({ fileType: 'file', mode: '4755' });
    expect(await driver.statPath(id, '/tmp')).toMatchObject({ fileType: 'directory', mode: '1777' });
    expect(await driver.statPath(id, '/dev/null')).toMatchObject({ fileType: 'other' });
    expect((await driver.statPath(id, '/')).fileType).toBe('directory');
    const now = Date.parse((await driver.statPath(id, '/root/st')).modifiedAt);
    expect(Math.abs(now - Date.now())).toBeLessThan(60_000);
    expect((await failure(driver.statPath(id, '/root/st/missing'))).code).toBe('path_missing');
    expect((await failure(driver.statPath(id, '/root/st/f/below'))).code).toBe('path_missing');
    for (let i = 0; i < 10; i++) await timed('stat', () => driver.statPath(id, '/root'));
  });

  it('lists directories in byte order, up to a limit', async () => {
    await sh(
      "mkdir -p /root/ls/sub && cd /root/ls && touch B _ a b 'sp ace' z '~' é && " +
        `touch "$(printf 'new\\nline')" "$(printf 'bad\\377name')" && ln -s sub to-sub && ln -sfn /root/ls /root/ls-link`,
    );
    const listing = await driver.listDir(id, '/root/ls', 100);
    const names = listing.entries.map((e) => e.name);
    expect(names).toEqual(['B', '_', 'a', 'b', 'bad\ufffdname', 'new\nline', 'sp ace', 'sub', 'to-sub', 'z', '~', 'é']);
    expect(listing.truncated).toBe(false);
    const byName = new Map(listing.entries.map((e) => [e.name, e]));
    expect(byName.get('sub')?.fileType).toBe('directory');
    expect(byName.get('to-sub')?.fileType).toBe('symlink');
    expect(byName.get('a')).toMatchObject({ fileType: 'file', sizeBytes: 0 });
    expect(Number.isNaN(Date.parse(byName.get('a')?.modifiedAt ?? ''))).toBe(false);

    expect(await driver.listDir(id, '/root/ls', 3)).toEqual({ entries: listing.entries.slice(0, 3), truncated: true });
    expect((await driver.listDir(id, '/root/ls', 12)).truncated).toBe(false);
    // The directory itself may be a symlink; its entries are not followed.
    expect((await driver.listDir(id, '/root/ls-link', 100)).entries.map((e) => e.name)).toEqual(names);
    expect((await failure(driver.listDir(id, '/root/ls/a', 10))).code).toBe('path_conflict');
    expect((await failure(driver.listDir(id, '/root/nope', 10))).code).toBe('path_missing');
    // The guest's root, not the host's.
    const root = await timed('list /', () => driver.listDir(id, '/', 2000));
    for (const e of root.entries) expect(GUEST_ROOT_NAMES.has(e.name), e.name).toBe(true);
    await timed('list /usr/bin', () => driver.listDir(id, '/usr/bin', 2000));
  });

  it('reads whole files and windows', async () => {
    await sh('printf 0123456789 > /root/r.txt && : > /root/empty && ln -sf r.txt /root/r-link && mkfifo /root/r-fifo');
    const whole = await read('/root/r.txt');
    expect([whole.size, whole.length, whole.eof]).toEqual([10, 10, true]);
    expect((await drain(whole)).toString()).toBe('0123456789');
    expect(await text('/root/r-link')).toBe('0123456789');
    expect(await text('/root/empty')).toBe('');
    expect((await failure(read('/root/r.txt', null, 0, 9))).code).toBe('too_large');

    const windows: Array<[number, number, string, boolean]> = [
      [0, 4, '0123', false],
      [3, 4, '3456', false],
      [6, 4, '6789', true],
      [8, 100, '89', true],
      [10, 4, '', true],
      [50, 4, '', true],
    ];
    for (const [offset, length, want, eof] of windows) {
      const w = await read('/root/r.txt', offset, length);
      expect({ size: w.size, length: w.length, eof: w.eof, data: (await drain(w)).toString() }).toEqual({
        size: 10, length: want.length, eof, data: want,
      });
    }
    const dir = await failure(read('/root'));
    expect(dir.code).toBe('path_conflict');
    expect(dir.message).toMatch(/directory/);
    expect((await failure(read('/root/r-fifo'))).code).toBe('path_conflict');
    expect((await failure(read('/root/missing'))).code).toBe('path_missing');
    expect((await failure(read('/root/r.txt/below'))).code).toBe('path_missing');
  });

  it('replaces files, creating parents and keeping mode and owner', async () => {
    await put('/root/w/deep/new.txt', 'one ', 'two');
    expect(await text('/root/w/deep/new.txt')).toBe('one two');
    expect((await driver.statPath(id, '/root/w/deep/new.txt')).mode).toBe('644');
    expect((await driver.statPath(id, '/root/w/deep')).mode).toBe('755');

    await sh('printf old > /root/w/owned && chmod 600 /root/w/owned && chown 1000:1000 /root/w/owned');
    await put('/root/w/owned', 'new');
    expect(await text('/root/w/owned')).toBe('new');
    expect(await sh('stat -c "%a %u:%g" /root/w/owned')).toBe('600 1000:1000');
    await put('/root/w/owned');
    expect(await text('/root/w/owned')).toBe('');

    // A final symlink is followed inside the guest: the target changes, the link stays.
    await sh('printf old > /root/w/target && ln -s target /root/w/link && ln -s /root/w/made/by-link /root/w/dangling');
    await put('/root/w/link', 'via link');
    expect(await text('/root/w/target')).toBe('via link');
    expect((await driver.statPath(id, '/root/w/link')).fileType).toBe('symlink');
    await put('/root/w/dangling', 'created');
    expect(await text('/root/w/made/by-link')).toBe('created');

    expect((await failure(put('/root/w', 'x'))).code).toBe('path_conflict');
    expect((await failure(put('/root/w/owned/below', 'x'))).code).toBe('path_conflict');
    for (const path of ['/usr/canto-probe', '/etc/canto-probe', '/etc/hostname', '/canto-probe', '/new-dir/x']) {
      const err = await failure(put(path, 'x'));
      expect(err.code, path).toBe('path_conflict');
      expect(err.message, path).toMatch(/read-only/);
    }

    const big = randomBytes(8 * MiB);
    for (let i = 0; i < 5; i++) await timed('write 8 MiB (replace)', () => put('/root/w/big', big));
    for (let i = 0; i < 5; i++) {
      const data = await timed('read 8 MiB', async () => drain(await read('/root/w/big', 0, 8 * MiB)));
      expect(data.equals(big)).toBe(true);
    }
  });

  it('leaves the old content when an upload fails midway', async () => {
    await put('/root/a/keep.txt', 'original');
    const broken = async function* () {
      yield Buffer.from('partial ');
      throw new Error('client went away');
    };
    await expect(driver.writeFile(id, { path: '/root/a/keep.txt', appendAt: null }, broken())).rejects.toThrow(
      'client went away',
    );
    expect(await text('/root/a/keep.txt')).toBe('original');
    await expect(driver.writeFile(id, { path: '/root/a/keep.txt', appendAt: 8 }, broken())).rejects.toThrow(
      'client went away',
    );
    expect(await text('/root/a/keep.txt')).toBe('original');

    // The helper killed mid-upload (as when the agent dies with it).
    let resume: () => void = () => undefined;
    const paused = async function* () {
      yield Buffer.from('half of it');
      await new Promise<void>((r) => (resume = r));
      yield Buffer.from(' and the rest');
    };
    const upload = driver.writeFile(id, { path: '/root/a/keep.txt', appendAt: null }, paused());
    let helpers: number[] = [];
    await until(async () => (helpers = await hostPidsWithArgs('write', '/root/a/keep.txt')).length > 0);
    for (const pid of helpers) process.kill(pid, 'SIGKILL');
    resume();
    expect((await failure(upload)).code).toBe('runtime_error');
    expect(await text('/root/a/keep.txt')).toBe('original');
    expect(await sh('ls -A /root/a')).toBe('keep.txt');
  });

  it('appends only at the current size, one winner per offset', async () => {
    await append('/root/ap/log', 0, 'abc');
    expect(await text('/root/ap/log')).toBe('abc');
    expect((await driver.statPath(id, '/root/ap/log')).mode).toBe('644');
    const mismatch = await failure(append('/root/ap/log', 5, 'x'));
    expect([mismatch.code, mismatch.currentSize]).toEqual(['path_conflict', 3]);
    const missing = await failure(append('/root/ap/none', 7, 'x'));
    expect([missing.code, missing.currentSize]).toEqual(['path_conflict', 0]);
    expect((await failure(driver.statPath(id, '/root/ap/none'))).code).toBe('path_missing');
    expect((await failure(append('/root/ap', 0, 'x'))).code).toBe('path_conflict');
    await append('/root/ap/log', 3, 'def');
    expect(await text('/root/ap/log')).toBe('abcdef');

    const racers = ['1111', '2222', '3333', '4444'];
    const results = await Promise.allSettled(racers.map((r) => append('/root/ap/log', 6, r)));
    const won = results.flatMap((r, i) => (r.status === 'fulfilled' ? [racers[i]] : []));
    expect(won).toHaveLength(1);
    for (const r of results) {
      if (r.status === 'rejected') {
        const err = r.reason as AgentFailure;
        expect([err.code, err.currentSize]).toEqual(['path_conflict', 10]);
      }
    }
    expect(await text('/root/ap/log')).toBe(`abcdef${won[0]}`);

    // 20 MiB in 8 MiB chunks, read back in 8 MiB windows.
    const data = randomBytes(20 * MiB);
    for (let at = 0; at < data.length; at += 8 * MiB) {
      await timed('write 8 MiB (append)', () => append('/root/ap/big', at, data.subarray(at, at + 8 * MiB)));
    }
    const back = createHash('sha256');
    for (let at = 0, eof = false; !eof; at += 8 * MiB) {
      const w = await read('/root/ap/big', at, 8 * MiB);
      back.update(await drain(w));
      eof = w.eof;
      expect(w.size).toBe(data.length);
    }
    expect(back.digest('hex')).toBe(sha256(data));
    expect(await sh('sha256sum /root/ap/big | cut -d" " -f1')).toBe(sha256(data));

    // A chunk over the cap is refused by the helper while the upload still comes: the refusal
    // arrives as such (not as a broken connection), and nothing is appended.
    const over = await failure(append('/root/ap/big', data.length, randomBytes(9 * MiB)));
    expect(over.code).toBe('too_large');
    expect((await driver.statPath(id, '/root/ap/big')).sizeBytes).toBe(data.length);
  });

  it('deletes files, links and trees without following links', async () => {
    await sh(
      'mkdir -p /root/d/tree/sub /root/d/empty /root/d/keep && echo x > /root/d/f && echo k > /root/d/keep/k && ' +
        'ln -s /root/d/keep /root/d/link && ln -s / /root/d/tree/root && ln -s /proc/1/root /root/d/tree/sub/proc && ' +
        'ln -s ../../../../.. /root/d/tree/up && echo t > /root/d/tree/sub/t',
    );
    await driver.deletePath(id, '/root/d/f', false);
    expect((await failure(driver.deletePath(id, '/root/d/f', false))).code).toBe('path_missing');
    await driver.deletePath(id, '/root/d/link', false);
    expect(await text('/root/d/keep/k')).toBe('k\n');
    const empty = await failure(driver.deletePath(id, '/root/d/empty', false));
    expect([empty.code, empty.message]).toEqual(['path_conflict', expect.stringMatching(/directory/)]);
    await driver.deletePath(id, '/root/d/empty', true);
    await driver.deletePath(id, '/root/d/tree', true);
    expect((await failure(driver.statPath(id, '/root/d/tree'))).code).toBe('path_missing');
    expect(await sh('ls /etc/hostname /usr/bin/sh /root/d/keep/k')).toContain('/usr/bin/sh');
    for (const path of ['/etc/hostname', '/usr/bin/sh', '/etc/shadow']) {
      expect((await failure(driver.deletePath(id, path, false))).code, path).toBe('path_conflict');
    }
    expect((await failure(driver.deletePath(id, '/usr/src', true))).code).toBe('path_conflict');
    expect((await failure(driver.deletePath(id, '/root/d/nope', true))).code).toBe('path_missing');
  });

  it('never reaches host files through symlinks', async () => {
    const shadowBefore = sha256(await readFile('/etc/shadow'));
    const hostSize = (await stat('/etc/shadow')).size;
    expect(hostSize).toBeGreaterThan(0);
    await sh(
      `mkdir -p /root/esc && cd /root/esc && ln -s / root && ln -s /etc/shadow shadow && ln -s /proc/1/root proc && ` +
        `ln -s ../../../../.. up && ln -s ${sentinel} sentinel && ln -s /proc/1/root${sentinel} proc-sentinel && ` +
        `ln -s /proc/1/root${hostDir} proc-dir`,
    );
    const links = ['/root/esc/sentinel', '/root/esc/proc-sentinel'];
    const through = [
      `/root/esc/root${sentinel}`, `/root/esc/proc${sentinel}`, `/root/esc/up${sentinel}`, `/proc/1/root${sentinel}`, sentinel,
    ];
    for (const path of [...links, ...through]) expect((await failure(read(path))).code, path).toBe('path_missing');
    for (const path of links) expect((await driver.statPath(id, path)).fileType, path).toBe('symlink');
    for (const path of through) {
      expect((await failure(driver.statPath(id, path))).code, path).toBe('path_missing');
      expect((await failure(driver.deletePath(id, path, false))).code, path).toBe('path_missing');
    }
    for (const dir of ['/root/esc/proc-dir', `/root/esc/up${hostDir}`, hostDir]) {
      expect((await failure(driver.listDir(id, dir, 10))).code, dir).toBe('path_missing');
    }
    for (const dir of ['/root/esc/root', '/root/esc/proc', '/root/esc/up']) {
      const listing = await driver.listDir(id, dir, 100);
      for (const e of listing.entries) expect(GUEST_ROOT_NAMES.has(e.name), `${dir}: ${e.name}`).toBe(true);
      expect(listing.entries.map((e) => e.name)).not.toContain(basename(hostDir));
    }
    // The guest sees the mask (a read-only bind of /dev/null), not a file, and cannot write through.
    expect((await failure(read('/root/esc/shadow'))).code).toBe('path_conflict');
    expect(await driver.statPath(id, '/etc/shadow')).toMatchObject({ fileType: 'other', sizeBytes: 0 });
    expect(await sh('cat /root/esc/shadow 2>/dev/null || true')).toBe('');
    expect((await failure(put('/root/esc/shadow', 'root::0:0:::::\n'))).code).toBe('path_conflict');
    expect((await failure(put(`/root/esc/proc/etc/passwd`, 'x'))).code).toBe('path_conflict');

    // Writes through the links land inside the guest (its /tmp is the desktop's disk), never on the host.
    await put('/root/esc/sentinel', 'GUEST-1');
    await put('/root/esc/proc-sentinel', 'GUEST-2');
    await append(`/root/esc/up${hostDir}/appended`, 0, 'GUEST-3');
    expect(await text(sentinel)).toBe('GUEST-2');
    expect(await readFile(sentinel, 'utf8')).toBe('HOST-SENTINEL');
    expect(await readdir(hostDir)).toEqual(['secret.txt']);
    const inDisk = join(stateDir, 'desktops', id, 'disk', 'tmp', basename(hostDir));
    expect((await readdir(inDisk)).sort()).toEqual(['appended', 'secret.txt']);
    expect((await driver.statPath(id, '/root/esc/sentinel')).fileType).toBe('symlink');
    await driver.deletePath(id, `/root/esc/proc${hostDir}`, true);
    expect(await readFile(sentinel, 'utf8')).toBe('HOST-SENTINEL');
    await driver.deletePath(id, '/root/esc/root', true);
    await driver.deletePath(id, '/root/esc/up', false);
    expect(await sh('ls /etc/hostname /usr/bin/sh >/dev/null && echo intact')).toBe('intact');
    expect(sha256(await readFile('/etc/shadow'))).toBe(shadowBefore);
  });
});
