/**
 * Guest operations through the HTTP API (docs/api.md §4.3) against a real awake sandbox desktop:
 * the real scheduler and a real agent in-process, the sandbox runtime, a real PostgreSQL. Exec,
 * detached processes, the display, and what the desktop's state and host do to them, over real
 * sockets. Files are in guest-files.test.ts; the world both share is
 * test/helpers/guest-api-world.ts.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { until } from '../helpers/scheduler.js';
import { expectProblem } from '../helpers/problem.js';
import { call, exec, id, isRoot, MiB, other, raw, restartAgent, scheduler, agent, useAwakeDesktop } from '../helpers/guest-api-world.js';

describe.skipIf(!isRoot)('guest operations through the API, on a real sandbox desktop', () => {
  useAwakeDesktop();

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
      for (const tail of ['99999999', '9223372036854775807']) expect((await call('GET', `${path}?tail_bytes=${tail}`)).json.stdout_tail).toHaveLength(512 * 1024);
      expectProblem(await call('GET', `${path}?tail_bytes=abc`), 400, 'non-numeric');
      expectProblem(await call('GET', `${path}?tail_bytes=-1`), 400, 'negative');
    });

    it('answers 404 for an unknown process id and 400 for a malformed one', async () => {
      expectProblem(await call('GET', `/v1/desktops/${id}/processes/${newId('process')}`), 404, 'unknown');
      expectProblem(await call('GET', `/v1/desktops/${id}/processes/bogus`), 400, 'malformed');
      expectProblem(await call('GET', `/v1/desktops/${id}/processes/..%2F..%2Fetc`), 400, 'traversal');
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
    beforeAll(async () => {
      // A file whose survival across hibernate and an agent restart the tests below check.
      expect((await raw('PUT', `/v1/desktops/${id}/files/root/log.txt`, Buffer.from('one\ntwo\n'))).status).toBe(204);
    });

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
      await restartAgent();
      const back = await exec('cat /root/log.txt');
      expect(back.status, back.text).toBe(200);
      expect(back.json.stdout).toBe('one\ntwo\n');
    }, 60_000);
  });
});
