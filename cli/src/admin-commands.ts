/**
 * The CLI's admin commands — `canto hosts …`, `canto desktops list|show|move`, `canto orgs …`, `canto keys …` — over the admin API
 * of a running scheduler, through the SDK's admin client (cli/src/admin-client.ts), so they work
 * from any machine that can reach it and see what the scheduler sees. Tables for people; `--json`
 * prints the API's answer for scripts. Every failure is one line on stderr and a non-zero exit
 * (cli/src/main.ts).
 */
import { Command, Option } from 'commander';
import { isId } from '../../shared/src/ids.js';
import { unwrap, type AdminDesktop, type AdminHost, type CantoAdmin } from '../../sdk/src/index.js';
import { describeDrain, describeMove, desktopCount, drainDetails, drainTotal, watchDrain, watchMove, WatchLost } from './drain-progress.js';
import { adminClient, adminTarget, explainAdminError, type AdminOptions } from './admin-client.js';
import { agoSince, hostStatusLabel, table } from './status.js';
import { linksLabel, linkWarning } from '../../scheduler/src/fleet/link-view.js';

interface CommonOptions extends AdminOptions {
  json?: boolean;
  /** `canto keys …`: the org, by id or name, and a new key's label. */
  org?: string;
  name?: string;
  /** Drains and moves. */
  parallel?: string;
  wait?: boolean;
  to?: string;
  /** `canto desktops list` filters and size. */
  host?: string;
  state?: string;
  limit?: string;
  all?: boolean;
  /** `canto hosts forget`: destroy the desktops, not just count them. */
  yes?: boolean;
}

type Action<A extends unknown[]> = (admin: CantoAdmin, opts: CommonOptions, ...args: A) => Promise<void>;

export function registerAdminCommands(program: Command, env: NodeJS.ProcessEnv): void {
  /** A subcommand with the options every admin command takes. */
  function adminCommand<A extends unknown[]>(parent: Command, name: string, description: string, action: Action<A>): Command {
    return parent
      .command(name)
      .description(description)
      .option('--api <url>', 'the scheduler (CANTO_API_URL; default: where canto up of the data directory serves)')
      .option('--data-dir <dir>', 'data directory of canto up; its secrets.json holds the admin token (else CANTO_ADMIN_TOKEN)')
      .option('--json', 'print JSON for scripts')
      .addOption(new Option('--token <token>').hideHelp())
      .action(async (...raw: unknown[]) => {
        // commander passes the arguments, then the options, then the command.
        const args = raw.slice(0, -2) as A;
        const opts = raw[raw.length - 2] as CommonOptions;
        const target = adminTarget(opts, env);
        try {
          await action(adminClient(target), opts, ...args);
        } catch (err) {
          throw explainAdminError(err, target);
        }
      });
  }
  const out = (line: string): void => {
    process.stdout.write(`${line}\n`);
  };
  const json = (value: unknown): void => out(JSON.stringify(value, null, 2));
  /** Watches a drain to its end: exit 0 drained, 1 stopped or ended, 2 lost sight of it (it goes on). */
  const followDrain = async (admin: CantoAdmin, opts: CommonOptions, hostId: string): Promise<void> => {
    try {
      const done = await watchDrain(admin, hostId, opts.json ? null : process.stderr);
      if (opts.json) json(done);
      else out(describeDrain(done));
      if (done.drain?.state !== 'drained') process.exitCode = 1;
    } catch (err) {
      if (!(err instanceof WatchLost)) throw err;
      process.stderr.write(`${err.message}\n`);
      process.exitCode = 2;
    }
  };

  const hosts = program.command('hosts').description('agent hosts, over the admin API');
  adminCommand(hosts, 'list', 'list hosts: state, schedulable, capacity and use, desktops', async (admin, opts) => {
    const answer = unwrap(await admin.api.GET('/admin/v1/hosts'));
    if (opts.json) return json(answer);
    out(table(answer.hosts.map(hostRow), ['ID', 'HOSTNAME', 'STATUS', 'RUNTIME', 'SCHEDULABLE', 'DESKTOPS', 'VCPU', 'MEMORY', 'FREE MEMORY', 'ROOM', 'SLOTS', 'LINKS', 'LAST HEARD']));
  });
  adminCommand<[string]>(hosts, 'show', 'one host in detail; with --wait, follow its drain until it ends (asks for nothing)', async (admin, opts, id) => {
    // A drain that has ended is told and exits as drain --wait would (0 drained, 1 otherwise).
    if (opts.wait) return followDrain(admin, opts, id);
    const host = unwrap(await admin.api.GET('/admin/v1/hosts/{host_id}', { params: { path: { host_id: id } } }));
    if (opts.json) return json(host);
    out(describeHost(host));
  })
    .argument('<host-id>')
    .option('--wait', 'follow a drain under way as drain --wait does, and exit as it would');
  for (const [action, words] of [['cordon', 'cordoned: no new desktop is placed on it'], ['uncordon', 'uncordoned: placement may use it again']] as const) {
    const description = action === 'cordon' ? 'place no new desktop on the host (those on it stay)' : 'let placement use the host again (this ends its drain; moves under way finish)';
    adminCommand<[string]>(hosts, action, description, async (admin, opts, id) => {
      const init = { params: { path: { host_id: id } } };
      // Read first, to say so when the uncordon ends a drain (a watch elsewhere then ends too).
      const before = action === 'uncordon' ? unwrap(await admin.api.GET('/admin/v1/hosts/{host_id}', init)) : null;
      const host = unwrap(action === 'cordon' ? await admin.api.POST('/admin/v1/hosts/{host_id}/cordon', init) : await admin.api.POST('/admin/v1/hosts/{host_id}/uncordon', init));
      if (opts.json) return json(host);
      const ended = before?.drain && before.drain.state !== 'drained' ? `; its drain (${before.drain.state}) ended, moves under way finish` : '';
      out(`host ${host.id} ${words}${ended}`);
    }).argument('<host-id>');
  }
  adminCommand<[string]>(hosts, 'remove', "remove a host's record: it must hold no desktop and its agent must be stopped", async (admin, opts, id) => {
    await admin.api.DELETE('/admin/v1/hosts/{host_id}', { params: { path: { host_id: id } } });
    if (opts.json) return json({ removed: id });
    out(`host ${id} removed`);
  }).argument('<host-id>');

  adminCommand<[string]>(hosts, 'forget', 'write off a host that is gone for good: destroy the desktops only it held, then remove it', async (admin, opts, id) => {
    const init = { params: { path: { host_id: id } } };
    if (!opts.yes) {
      const host = unwrap(await admin.api.GET('/admin/v1/hosts/{host_id}', init));
      throw new Error(
        `host ${host.id} (${host.hostname}) holds ${desktopCount(host.desktops.total)}, whose disks are only on it: forgetting it destroys them for good ` +
          `(a host that may come back should be waited for; a host that is up should be drained). Run again with --yes to forget it`,
      );
    }
    // A desktop is placed back once, by the call that finds it: each is told as it comes, and the
    // JSON of the last call carries those of every call (the last one's alone is usually none).
    const placedBack: Array<{ desktop_id: string; host_id: string; move_id: string }> = [];
    for (;;) {
      const forgotten = unwrap(await admin.api.POST('/admin/v1/hosts/{host_id}/forget', { ...init, body: {} }));
      placedBack.push(...forgotten.placed_back);
      if (!opts.json) for (const back of forgotten.placed_back) process.stderr.write(`desktop ${back.desktop_id} placed back on ${back.host_id}, which its move (${back.move_id}) came from and which kept its copy\n`);
      if (forgotten.removed || !opts.wait) {
        if (opts.json) return json({ ...forgotten, placed_back: placedBack });
        return out(forgotten.removed
          ? `host ${id} forgotten and removed: its desktops are destroyed${placedBack.length > 0 ? ` (${placedBack.length} placed back on the hosts their moves came from)` : ''}`
          : `host ${id} declared lost: ${forgotten.destroying} desktop(s) being destroyed, ${forgotten.waiting} waiting for an operation to end (run again, or with --wait)`);
      }
      if (!opts.json) process.stderr.write(`host ${id}: ${forgotten.destroying} desktop(s) being destroyed, ${forgotten.waiting} waiting for an operation to end\n`);
      await new Promise((resolve) => setTimeout(resolve, 1_000));
    }
  })
    .argument('<host-id>')
    .option('--yes', 'destroy its desktops: without it, only say how many there are')
    .option('--wait', 'ask again until the host is removed');
  adminCommand<[string]>(hosts, 'reset-key', "forget the key a host registered with (its host-key file is lost): its agent's next hello records its new key", async (admin, opts, id) => {
    const host = unwrap(await admin.api.POST('/admin/v1/hosts/{host_id}/reset-key', { params: { path: { host_id: id } }, body: {} }));
    if (opts.json) return json(host);
    out(`host ${host.id}: key forgotten; restart its agent now (the next hello naming ${host.id} registers its key)`);
  }).argument('<host-id>');

  adminCommand<[string]>(hosts, 'drain', 'cordon the host and move every desktop off it (awake ones come back awake)', async (admin, opts, id) => {
    const body = opts.parallel === undefined ? {} : { parallel: Number(opts.parallel) };
    const host = unwrap(await admin.api.POST('/admin/v1/hosts/{host_id}/drain', { params: { path: { host_id: id } }, body }));
    if (!opts.wait) return opts.json ? json(host) : out(`host ${host.id} draining: ${desktopCount(drainTotal(host))} to move (canto hosts show ${host.id} --wait)`);
    await followDrain(admin, opts, host.id);
  })
    .argument('<host-id>')
    .option('--parallel <n>', 'moves at a time, 1-32 (default 2; asked again without it, a drain keeps its own)')
    .option('--wait', 'show progress until the host is empty; exit 1 if a desktop could not be moved, 2 if the admin API stayed out of reach');

  const desktops = program.command('desktops').description('desktops of any org, over the admin API');
  adminCommand(desktops, 'list', 'list desktops of every org: state, host, and the operation at work on each', async (admin, opts) => {
    const limit = opts.all ? Infinity : Number(opts.limit ?? DEFAULT_LIST);
    if (!(limit >= 1)) throw new Error(`--limit must be a positive number, got "${opts.limit}"`);
    const query = {
      host_id: opts.host,
      org_id: opts.org === undefined ? undefined : await orgId(admin, opts.org, false),
      state: opts.state as AdminDesktop['state'] | undefined,
    };
    const listed: AdminDesktop[] = [];
    let after: string | undefined;
    let more = false;
    do {
      const page = unwrap(await admin.api.GET('/admin/v1/desktops', { params: { query: { ...query, after, limit: String(Math.min(1000, limit - listed.length)) } } }));
      listed.push(...page.desktops);
      after = page.next_after ?? undefined;
      more = after !== undefined;
    } while (more && listed.length < limit);
    if (opts.json) return json({ desktops: listed, next_after: more ? after : null });
    out(table(listed.map(desktopRow), ['ID', 'ORG', 'STATE', 'TIER', 'HOST', 'GENERATION', 'OPERATION']));
    if (more) process.stderr.write(`more desktops follow: --limit N or --all lists them\n`);
  })
    .option('--host <host-id>', 'only those on this host')
    .option('--org <org>', 'only this org (id or name)')
    .addOption(new Option('--state <state>', 'only those in this state (destroyed ones only when asked for)').choices(['provisioning', 'waking', 'awake', 'hibernating', 'hibernated', 'destroyed']))
    .option('--limit <n>', `list at most n (default ${DEFAULT_LIST})`)
    .option('--all', 'list every one');
  adminCommand<[string]>(desktops, 'show', 'one desktop of any org: where it is and what works on it', async (admin, opts, id) => {
    const desktop = unwrap(await admin.api.GET('/admin/v1/desktops/{desktop_id}', { params: { path: { desktop_id: id } } }));
    if (opts.json) return json(desktop);
    out(describeDesktop(desktop));
  }).argument('<desktop-id>');
  adminCommand<[string]>(desktops, 'move', 'move a desktop to another host (placement picks one unless --to names it)', async (admin, opts, id) => {
    let op = unwrap(await admin.api.POST('/admin/v1/desktops/{desktop_id}/move', { params: { path: { desktop_id: id } }, body: { host_id: opts.to ?? null } }));
    if (opts.wait) {
      // No deadline: a move ends, succeeded or rolled back. Exit 1 when it failed, 2 when the API
      // was lost from sight (the move goes on), as a drain's watch does.
      try {
        op = await watchMove(admin, op, opts.json ? null : process.stderr, (o) => moveHosts(admin, o));
      } catch (err) {
        if (!(err instanceof WatchLost)) throw err;
        process.stderr.write(`${err.message}\n`);
        process.exitCode = 2;
        return;
      }
      if (op.state === 'failed') process.exitCode = 1;
    }
    if (opts.json) return json(op);
    if (!opts.wait) return out(`moving ${op.desktop_id}: operation ${op.id}`);
    out(describeMove(op));
  })
    .argument('<desktop-id>')
    .option('--to <host-id>', 'the target host')
    .option('--wait', 'wait until the move settles; exit non-zero if it failed');

  const orgs = program.command('orgs').description('orgs, over the admin API');
  adminCommand(orgs, 'list', 'list orgs with their key and desktop counts', async (admin, opts) => {
    const answer = unwrap(await admin.api.GET('/admin/v1/orgs'));
    if (opts.json) return json(answer);
    out(table(answer.orgs.map((o) => ({ ID: o.id, NAME: o.name, KEYS: String(o.key_count), DESKTOPS: String(o.desktop_count), CREATED: o.created_at })), ['ID', 'NAME', 'KEYS', 'DESKTOPS', 'CREATED']));
  });
  adminCommand<[string]>(orgs, 'create', 'create an org', async (admin, opts, name) => {
    const org = unwrap(await admin.api.POST('/admin/v1/orgs', { body: { name } }));
    if (opts.json) return json(org);
    out(`org ${org.name} created: ${org.id}`);
  }).argument('<name>');

  const keys = program.command('keys').description("an org's API keys, over the admin API");
  adminCommand(keys, 'list', "list an org's live keys (never their secrets)", async (admin, opts) => {
    const org = await orgId(admin, opts.org!, false);
    const answer = unwrap(await admin.api.GET('/admin/v1/orgs/{org_id}/keys', { params: { path: { org_id: org } } }));
    if (opts.json) return json(answer);
    out(table(answer.keys.map((k) => ({ ID: k.id, NAME: k.name ?? '', PREFIX: k.prefix ?? '', CREATED: k.created_at, 'LAST USED': k.last_used_at ?? 'never' })), ['ID', 'NAME', 'PREFIX', 'CREATED', 'LAST USED']));
  }).requiredOption('--org <org>', 'org id or name');
  adminCommand(keys, 'create', 'create an API key (and the org, if no org has this name); prints only the key', async (admin, opts) => {
    const org = await orgId(admin, opts.org!, true);
    const created = unwrap(await admin.api.POST('/admin/v1/orgs/{org_id}/keys', { params: { path: { org_id: org } }, body: { name: opts.name ?? null } }));
    if (opts.json) return json(created);
    out(created.key);
  })
    .requiredOption('--org <org>', 'org id or name')
    .option('--name <name>', 'a label for people');
  adminCommand<[string]>(keys, 'revoke', 'revoke an API key: every replica refuses it from its next request', async (admin, opts, keyId) => {
    const org = await orgId(admin, opts.org!, false);
    await admin.api.DELETE('/admin/v1/orgs/{org_id}/keys/{key_id}', { params: { path: { org_id: org, key_id: keyId } } });
    if (opts.json) return json({ revoked: keyId });
    out(`key ${keyId} revoked`);
  })
    .requiredOption('--org <org>', 'org id or name')
    .argument('<key-id>');
}

/** The source and target hosts of a move, as far as they can be read now (none when the API does not answer). */
async function moveHosts(admin: CantoAdmin, op: { source_host_id: string | null; target_host_id: string | null }): Promise<AdminHost[]> {
  const ids = [op.source_host_id, op.target_host_id].filter((id): id is string => id !== null);
  const read = await Promise.all(ids.map((id) => admin.api.GET('/admin/v1/hosts/{host_id}', { params: { path: { host_id: id } } }).then((r) => r.data ?? null, () => null)));
  return read.filter((h): h is AdminHost => h !== null);
}

/** The id of the org `value` names (an `org_…` id, or a name); created when asked and missing. */
async function orgId(admin: CantoAdmin, value: string, create: boolean): Promise<string> {
  if (isId('org', value)) return value;
  const { orgs } = unwrap(await admin.api.GET('/admin/v1/orgs'));
  const found = orgs.find((o) => o.name === value);
  if (found) return found.id;
  if (!create) throw new Error(`no org is named "${value}" (canto orgs list shows them)`);
  return unwrap(await admin.api.POST('/admin/v1/orgs', { body: { name: value } })).id;
}

/** What `canto desktops list` shows without `--limit` or `--all`. */
const DEFAULT_LIST = 100;

function operationLabel(d: AdminDesktop): string {
  const op = d.operation;
  if (op === null) return '-';
  return `${op.kind} ${op.id} (${op.phase ?? op.state})`;
}

function desktopRow(d: AdminDesktop): Record<string, string> {
  return {
    ID: d.id,
    ORG: d.org_id,
    STATE: d.state,
    TIER: d.tier,
    HOST: d.host_id === null ? '-' : `${d.host_id}${d.host_state === 'down' ? ' (down)' : ''}`,
    GENERATION: String(d.generation),
    OPERATION: operationLabel(d),
  };
}

function describeDesktop(d: AdminDesktop): string {
  const lines: Array<[string, string]> = [
    ['ID', d.id],
    ['Org', d.org_id],
    ['State', d.state],
    ['Tier', d.tier],
    ['Host', d.host_id === null ? 'none yet (never placed)' : `${d.host_id} (${d.host_state})`],
    ['Generation', String(d.generation)],
    ['Created', d.created_at],
    ['Last woken', d.last_woken_at ?? 'never'],
    ['Forked from', d.forked_from ?? '-'],
    ['Ephemeral', d.ephemeral ? 'yes' : 'no'],
    ['Operation', d.operation === null ? 'none' : operationLabel(d)],
  ];
  return keyValues(lines);
}

const gib = (mb: number) => (mb / 1024).toFixed(1);

function hostRow(h: AdminHost): Record<string, string> {
  return {
    ID: h.id,
    HOSTNAME: h.hostname,
    STATUS: hostStatusLabel(h.state, h.cordoned, h.drain?.state ?? null, h.lost_at !== null),
    RUNTIME: `${h.agent.runtime}${h.agent.memory_snapshots ? '+snapshots' : ''}`,
    SCHEDULABLE: h.schedulable ? 'yes' : 'no',
    DESKTOPS: `${h.desktops.total} (${h.desktops.awake} awake)`,
    VCPU: h.capacity.vcpus === null ? `${h.used.vcpus}` : `${h.used.vcpus}/${h.capacity.vcpus}`,
    MEMORY: h.capacity.memory_mb === null ? `${gib(h.used.memory_mb)} GiB` : `${gib(h.used.memory_mb)}/${gib(h.capacity.memory_mb)} GiB`,
    'FREE MEMORY': h.measured === null ? '-' : `${gib(h.measured.memory_available_mb)} GiB`,
    ROOM: `${h.memory.room_desktops}`,
    SLOTS: `${h.used.slots}/${h.capacity.slots}`,
    LINKS: linksLabel(h.links),
    'LAST HEARD': agoSince(h.last_heartbeat_at),
  };
}

function describeHost(h: AdminHost): string {
  const states = (['provisioning', 'waking', 'awake', 'hibernating', 'hibernated'] as const).filter((s) => h.desktops[s] > 0);
  const lines: Array<[string, string]> = [
    ['ID', h.id],
    ['Hostname', h.hostname],
    ['Address', h.address ?? '(no port gateway)'],
    ['State', `${h.state}${h.linked ? '' : ' (not linked to the replica that answered)'}`],
    ['Cordoned', h.cordoned ? 'yes' : 'no'],
    ...(h.lost_at ? [['Lost', `declared lost ${h.lost_at}: its desktops are being destroyed (canto hosts forget ${h.id} --yes --wait)`] as [string, string]] : []),
    ['Schedulable', h.schedulable ? 'yes' : 'no'],
    ['Agent', `protocol ${h.agent.protocol}, runtime ${h.agent.runtime}, memory snapshots ${h.agent.memory_snapshots ? 'yes' : 'no'}`],
    ['Last heard', `${h.last_heartbeat_at} (${agoSince(h.last_heartbeat_at)})`],
    ['Links', describeLinks(h)],
    ...(h.unrecorded_since === null ? [] : [['Unrecorded', `! runs more desktops than its records let run, since ${h.unrecorded_since} (${agoSince(h.unrecorded_since)}): restart its agent to stop those it may not run`] as [string, string]]),
    ['vCPU', `${h.used.vcpus} ${h.capacity.vcpus === null ? '' : `of ${h.capacity.vcpus} `}committed by tier (${h.reported.vcpus} reported)`],
    ['Memory', `${h.used.memory_mb} ${h.capacity.memory_mb === null ? '' : `of ${h.capacity.memory_mb} `}MiB committed by tier (${h.reported.memory_mb} reported)`],
    ['Measured', h.measured === null
      ? 'not reported yet (agents before protocol 1.11 never do)'
      : `${h.measured.memory_available_mb} MiB available, ${h.measured.desktops_memory_mb} MiB in desktops, ${h.measured.running_desktops} running, ` +
        `CPU ${Math.round(h.measured.cpu_busy * 100)}% busy (${agoSince(h.measured.at)})`],
    ['Room', `${h.memory.room_mb} MiB above its ${h.memory.reserve_mb} MiB reserve: ${h.memory.room_desktops} more desktops by measured memory`],
    ['Slots', `${h.used.slots} of ${h.capacity.slots} held`],
    ['Desktops', h.desktops.total === 0 ? 'none' : `${states.map((s) => `${h.desktops[s]} ${s}`).join(', ')} (${h.desktops.total} in all)`],
    ...drainDetails(h),
  ];
  return keyValues(lines);
}

/** Which replicas the agent is linked to, and what a missing link means. */
function describeLinks(h: AdminHost): string {
  const { linked, unlinked, settling } = h.links;
  const all = linked.length + unlinked.length + settling.length;
  if (all === 0) return 'not recorded (replicas of an older version)';
  const parts = [`linked to ${linked.length} of ${all} replicas${h.links.leader_linked === true ? ', the leader among them' : ''}`];
  if (settling.length > 0) parts.push(`still linking to ${settling.join(', ')}`);
  const warning = linkWarning(h.links);
  return [...parts, ...(warning === null ? [] : [`! ${warning}`])].join('; ');
}

/** `Key   value` lines, the values lined up: what `show` commands print. */
function keyValues(lines: ReadonlyArray<readonly [string, string]>): string {
  const width = Math.max(...lines.map(([k]) => k.length));
  return lines.map(([k, v]) => `${k.padEnd(width)}  ${v}`).join('\n');
}
