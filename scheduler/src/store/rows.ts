/** Row shapes of the scheduler's tables, as the store returns them. */
import type { Tier } from '../../../shared/src/tiers.js';

export const DESKTOP_STATES = ['provisioning', 'waking', 'awake', 'hibernating', 'hibernated', 'destroyed'] as const;
export type DesktopState = (typeof DESKTOP_STATES)[number];
export type BillingMode = 'monthly' | 'hourly';
export type OperationKind = 'wake' | 'hibernate' | 'destroy' | 'fork' | 'move';
export type OperationState = 'pending' | 'running' | 'succeeded' | 'failed';

export interface DesktopRow {
  id: string;
  org_id: string;
  tier: Tier;
  state: DesktopState;
  image_version: string;
  generation: number;
  current_generation_id: string;
  idle_timeout_secs: number;
  billing_mode: BillingMode;
  host_id: string | null;
  env_sealed: Buffer | null;
  ephemeral: boolean;
  forked_from: string | null;
  setup_script_sealed: Buffer | null;
  /** Whether the two sealed values are bound to the org (crypto/desktop-secrets.ts); false on rows an older version wrote. */
  secrets_bound: boolean;
  created_event_at: Date | null;
  first_woken_at: Date | null;
  last_woken_at: Date | null;
  created_at: Date;
  destroyed_at: Date | null;
  /** The move operation carrying the desktop between hosts, while it does (engine/move.ts). */
  moving_operation_id: string | null;
  /** The host's status, where the query joined it (store/desktops.ts `getDesktop`, store/desktop-reads.ts). */
  host_status?: 'ready' | 'down' | null;
}

export interface OperationError {
  code: string;
  message: string;
  [key: string]: unknown;
}

export interface OperationRow {
  id: string;
  org_id: string;
  desktop_id: string;
  kind: OperationKind;
  state: OperationState;
  idempotency_key: string | null;
  from_state: DesktopState;
  reason: string;
  result: Record<string, unknown> | null;
  error: OperationError | null;
  /** Fork: `{count, ephemeral, desktop_ids}`; null for the other kinds. */
  params: Record<string, unknown> | null;
  attempts: number;
  created_at: Date;
  started_at: Date | null;
  settled_at: Date | null;
}

export interface HostRow {
  id: string;
  hostname: string;
  agent_instance_id: string;
  protocol: string;
  runtime: string;
  memory_snapshots: boolean;
  vcpus: number;
  memory_mb: number;
  status: 'ready' | 'down';
  cordoned: boolean;
  last_seen_at: Date;
  /** When the previous agent instance was last heard from (set when a new instance says hello). */
  previous_seen_at: Date | null;
  ingress_address: string | null;
  /** `host:port` of the agent's transfer server (protocol 1.8); null when it has none. */
  transfer_address: string | null;
  /** Set when a drain was asked for; the drain runs until the host holds no desktop. */
  drain_requested_at: Date | null;
  drain_parallel: number | null;
  drain_finished_at: Date | null;
  drain_error: string | null;
  /** When a drain stopped by a failed move was asked for again; failures before it no longer count. */
  drain_resumed_at: Date | null;
  /** When an operator declared the host lost for good (its desktops are destroyed without it). */
  lost_at: Date | null;
  /** The agent's last measured use (protocol 1.11 heartbeats); null until it reports one. */
  measured_at: Date | null;
  running_desktops: number | null;
  memory_available_mb: number | null;
  desktops_memory_mb: number | null;
  cpu_busy: number | null;
  /** When the agent instance now running first said hello; null on rows from before that was recorded. */
  instance_since: Date | null;
  /** Since when its heartbeats have counted more running desktops than the records let run there; null while they agree. */
  unrecorded_since: Date | null;
  created_at: Date;
}
