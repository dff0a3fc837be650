/**
 * `createCantoAdmin`: the typed client of the admin API (`/admin/v1`, its own OpenAPI document),
 * for operators' tooling and the `canto` CLI. Same transport as the `/v1` client — retries of
 * 503/429 on safe requests, problems thrown as `CantoProblem` — and a wait for moves, which are
 * operations of the admin API.
 */
import type { Client } from 'openapi-fetch';
import type { operations, paths } from './generated/admin.js';
import { pollOperation, type WaitOptions } from './operations.js';
import { createTransport, type TransportOptions } from './transport.js';

/** The JSON a successful admin operation answers with. */
type Answer<Op extends keyof operations, Status extends number = 200> = operations[Op]['responses'] extends Record<Status, { content: { 'application/json': infer T } }> ? T : never;

export type AdminHost = Answer<'getHost'>;
export type AdminOrg = Answer<'listOrgs'>['orgs'][number];
export type AdminKey = Answer<'listOrgKeys'>['keys'][number];
export type AdminCreatedKey = Answer<'createOrgKey', 201>;
export type AdminOperation = Answer<'getAdminOperation'>;
export type AdminDesktop = Answer<'getAdminDesktop'>;

export interface CantoAdminOptions extends Omit<TransportOptions, 'token'> {
  /** The deployment's admin token (CANTO_ADMIN_TOKEN). */
  adminToken: string;
}

export class CantoAdmin {
  /** The typed client for every `/admin/v1` route; answers of 400 and up are thrown as `CantoProblem`. */
  readonly api: Client<paths>;

  constructor(options: CantoAdminOptions) {
    const { adminToken, ...transport } = options;
    this.api = createTransport<paths>({ ...transport, token: adminToken });
  }

  async getOperation(id: string, signal?: AbortSignal): Promise<AdminOperation> {
    const { data } = await this.api.GET('/admin/v1/operations/{operation_id}', { params: { path: { operation_id: id } }, signal });
    return data!;
  }

  /** Polls a move until it settles; see `Canto.waitForOperation` for what it throws. */
  waitForOperation(op: AdminOperation, options: WaitOptions = {}): Promise<AdminOperation> {
    return pollOperation(op, (id, signal) => this.getOperation(id, signal), options);
  }
}

export function createCantoAdmin(options: CantoAdminOptions): CantoAdmin {
  return new CantoAdmin(options);
}
