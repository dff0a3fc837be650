/**
 * The admin API's shapes (TypeBox): what its routes validate and answer, and what its own OpenAPI
 * document is generated from. They carry no `$id`, so they stay out of the `/v1` document's
 * components; a key's shape is the one `/v1/keys` answers, spread rather than referenced.
 */
import { Type, type Static } from '@sinclair/typebox';
import { idPattern } from '../../../shared/src/ids.js';
import { ApiKeyJson, CreatedApiKeyJson, NO_CONTROL } from '../api/schemas.js';
import { DrainJson } from './moves.js';

const Resources = (description: string) =>
  Type.Object(
    {
      vcpus: Type.Number({ minimum: 0 }),
      memory_mb: Type.Number({ minimum: 0 }),
      slots: Type.Integer({ minimum: 0 }),
    },
    { description },
  );

const count = Type.Integer({ minimum: 0 });
export const HostDesktopCounts = Type.Object(
  { provisioning: count, waking: count, awake: count, hibernating: count, hibernated: count, total: count },
  { description: 'Desktops placed on the host, by state (destroyed ones are no longer on it)' },
);
export type HostDesktopCounts = Static<typeof HostDesktopCounts>;

export const AdminHostJson = Type.Object({
  id: Type.String({ description: '`host_…`' }),
  hostname: Type.String({ description: 'The host name its agent reported' }),
  address: Type.Union([Type.String(), Type.Null()], { description: "`host:port` of the agent's port gateway; null when it has none" }),
  state: Type.Union([Type.Literal('ready'), Type.Literal('down')], {
    description: '`ready`: its agent is heard from and takes work; `down`: silent for longer than CANTO_HOST_DOWN_MS (or fencing after a restart)',
  }),
  linked: Type.Boolean({ description: "Whether the agent's link to the replica that answered is up" }),
  links: Type.Object(
    {
      linked: Type.Array(Type.String(), { description: 'Replicas the agent is linked to' }),
      unlinked: Type.Array(Type.String(), {
        description: 'Replicas it is not linked to although both have run for 5 s: guest calls they serve answer 503, and on the leader lifecycle operations fail `host_unavailable`',
      }),
      settling: Type.Array(Type.String(), { description: 'Replicas it is not linked to yet, within 5 s of the replica or the agent starting' }),
      leader: Type.Union([Type.String(), Type.Null()], { description: 'The replica that leads; null when none holds the lease' }),
      leader_linked: Type.Union([Type.Boolean(), Type.Null()], {
        description: 'Whether it is linked to the leader, which runs lifecycle operations over its own links; null when no replica leads or the leader has not said yet',
      }),
    },
    {
      description: "The agent's links to every live replica, as each last recorded them (every second); replicas of versions that do not record them are left out. " +
        'A host that some replicas reach and others do not (a partial partition) still reads `ready`',
    },
  ),
  cordoned: Type.Boolean({ description: 'A cordoned host gets no new desktops; those on it stay' }),
  schedulable: Type.Boolean({ description: 'Whether placement may put new desktops here: ready and not cordoned (a drain cordons)' }),
  agent: Type.Object({
    protocol: Type.String({ description: 'The agent link protocol version the agent speaks (`major.minor`)' }),
    runtime: Type.String({ description: 'Its runtime driver (`sandbox`, `fake`, …)' }),
    memory_snapshots: Type.Boolean({ description: 'Whether hibernation keeps memory (wake resumes running programs)' }),
    instance_id: Type.String({ description: 'Changes whenever the agent restarts' }),
  }),
  last_heartbeat_at: Type.String({ format: 'date-time', description: 'When a replica last heard from the agent' }),
  unrecorded_since: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
    description: 'Since when its heartbeats have counted more running desktops than its records let run there (one may run unbilled); null while they agree',
  }),
  registered_at: Type.String({ format: 'date-time' }),
  reported: Type.Object(
    { vcpus: Type.Integer({ minimum: 0 }), memory_mb: Type.Integer({ minimum: 0 }) },
    { description: 'The capacity the agent reported' },
  ),
  capacity: Type.Object(
    {
      vcpus: Type.Union([Type.Number({ minimum: 0 }), Type.Null()], { description: 'Reported vCPUs times CANTO_CPU_OVERCOMMIT; null when that is 0 (no nominal cap, the default)' }),
      memory_mb: Type.Union([Type.Number({ minimum: 0 }), Type.Null()], { description: 'Reported memory times CANTO_MEMORY_OVERCOMMIT; null when that is 0 (no nominal cap, the default)' }),
      slots: Type.Integer({ minimum: 0 }),
    },
    { description: 'Nominal limits placement applies: tier sizes of running desktops within reported capacity times the overcommit, and CANTO_HOST_SLOTS' },
  ),
  used: Resources('What is committed: CPU and memory of desktops running or about to, slots of every desktop placed here'),
  measured: Type.Union(
    [
      Type.Object({
        at: Type.String({ format: 'date-time', description: 'When it was recorded' }),
        running_desktops: Type.Integer({ minimum: 0, description: 'Desktops running on the host' }),
        memory_available_mb: Type.Integer({ minimum: 0, description: "The host's available memory (MemAvailable)" }),
        desktops_memory_mb: Type.Integer({ minimum: 0, description: "Memory charged to the machine's desktop cgroups" }),
        cpu_busy: Type.Number({ minimum: 0, maximum: 1, description: 'Fraction of all cores busy over the last heartbeat interval' }),
      }),
      Type.Null(),
    ],
    { description: "The host's use as its agent last measured it (heartbeats); null until it reports one (agents before protocol 1.11)" },
  ),
  memory: Type.Object(
    {
      reserve_mb: Type.Integer({ minimum: 0, description: 'Memory placement keeps free: CANTO_MEMORY_RESERVE_PERCENT of the reported memory' }),
      room_mb: Type.Integer({ minimum: 0, description: 'Memory new desktops may still take: available memory, less CANTO_DESKTOP_EXPECTED_MB for each desktop the measure does not show yet, less the reserve' }),
      room_desktops: Type.Integer({ minimum: 0, description: 'How many more desktops placement would admit by memory: room_mb over CANTO_DESKTOP_EXPECTED_MB' }),
    },
    { description: 'Placement by measured memory: a host takes a desktop while room_desktops is at least 1' },
  ),
  desktops: HostDesktopCounts,
  drain: DrainJson,
  lost_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
    description: 'When an operator declared the host lost for good (forget): its desktops are destroyed without it, its agent is refused, and it is removed once it holds none',
  }),
});
export type AdminHostJson = Static<typeof AdminHostJson>;

export const AdminOrgJson = Type.Object({
  id: Type.String({ description: '`org_…`' }),
  name: Type.String(),
  created_at: Type.String({ format: 'date-time' }),
  key_count: Type.Integer({ minimum: 0, description: 'Live API keys' }),
  desktop_count: Type.Integer({ minimum: 0, description: 'Desktops not destroyed' }),
});
export type AdminOrgJson = Static<typeof AdminOrgJson>;

export const AdminKeyJson = Type.Object({ ...ApiKeyJson.properties });
export const AdminCreatedKeyJson = Type.Object({ ...CreatedApiKeyJson.properties });

export const HostIdParams = Type.Object({ host_id: Type.String({ pattern: idPattern('host'), description: '`host_…`' }) });
export const OrgIdParams = Type.Object({ org_id: Type.String({ pattern: idPattern('org'), description: '`org_…`' }) });
export const OrgKeyParams = Type.Object({
  ...OrgIdParams.properties,
  key_id: Type.String({ pattern: idPattern('apiKey'), description: '`key_…`' }),
});

/** Printable, no control characters, no space at either end. */
const ORG_NAME_PATTERN = '^[^\\p{Cc}\\s](?:[^\\p{Cc}]*[^\\p{Cc}\\s])?$';

export const CreateOrgBody = Type.Object(
  { name: Type.String({ minLength: 1, maxLength: 200, pattern: ORG_NAME_PATTERN, description: "The org's name, unique; what a JWT's org claim names" }) },
  { additionalProperties: false },
);
export type CreateOrgBody = Static<typeof CreateOrgBody>;

export const CreateOrgKeyBody = Type.Object(
  { name: Type.Optional(Type.Union([Type.String({ minLength: 1, maxLength: 100, pattern: NO_CONTROL }), Type.Null()], { description: 'A label for people, 1-100 characters, no control characters' })) },
  { additionalProperties: false },
);
export type CreateOrgKeyBody = Static<typeof CreateOrgKeyBody>;

export const ForgetHostJson = Type.Object({
  host_id: Type.String(),
  lost_at: Type.String({ format: 'date-time' }),
  destroying: Type.Integer({ minimum: 0, description: 'Desktops of the host whose destroy is under way' }),
  waiting: Type.Integer({ minimum: 0, description: 'Desktops with another operation still open (it fails soon: the host is lost); ask again to destroy them' }),
  placed_back: Type.Array(
    Type.Object({
      desktop_id: Type.String(),
      host_id: Type.String({ description: 'The host the move came from, which kept the copy it stopped' }),
      move_id: Type.String({ description: 'The failed move' }),
    }, { additionalProperties: false }),
    {
      description:
        'Desktops placed back, hibernated, on the host their move came from by this call instead of being destroyed: ' +
        'a move committed them to the lost host, which went away before they ever ran there',
    },
  ),
  removed: Type.Boolean({ description: 'The host held no desktop any more, and its record is gone' }),
});
export type ForgetHostJson = Static<typeof ForgetHostJson>;
