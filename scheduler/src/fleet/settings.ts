/**
 * The settings every replica of one deployment must share, as each replica publishes them in the
 * registry. Replicas that disagree split the service in ways that are hard to see from outside:
 * exposure URLs built on two domains, env sealed under a key another replica cannot open, agents
 * accepted by one replica and refused by the next, failover judged on two clocks. Secrets appear
 * as short SHA-256 fingerprints only: enough to tell two values apart, nothing to recover them.
 */
import { createHash } from 'node:crypto';
import { PROTOCOL_VERSION } from '../../../shared/src/protocol.js';
import { formatHostPort } from '../../../shared/src/host-port.js';
import { parseSecretKey } from '../crypto/secret-box.js';
import type { SchedulerConfig } from '../config.js';

export function fingerprint(value: string | Buffer): string {
  return `sha256:${createHash('sha256').update(value).digest('hex').slice(0, 12)}`;
}

export function sharedSettings(config: SchedulerConfig): Record<string, string | number | null> {
  const ingress = config.ingress;
  return {
    ingress_base_url: ingress ? `${ingress.scheme}://${ingress.urlPort === null ? ingress.domain : formatHostPort(ingress.domain, ingress.urlPort)}` : null,
    secret_key: fingerprint(parseSecretKey(config.secretKey)),
    join_token: config.joinToken ? fingerprint(config.joinToken) : null,
    admin_token: config.adminToken ? fingerprint(config.adminToken) : null,
    jwt: config.jwt ? `${config.jwt.jwksUrl} iss=${config.jwt.issuer} aud=${config.jwt.audience} claim=${config.jwt.orgClaim}` : null,
    protocol: PROTOCOL_VERSION,
    lease_ttl_ms: config.leaseTtlMs,
    heartbeat_ms: config.heartbeatMs,
    host_down_ms: config.hostDownMs,
    host_failure_grace_ms: config.hostFailureGraceMs,
    host_slots: config.hostSlots,
    org_desktop_quota: config.orgDesktopQuota,
    cpu_overcommit: config.placement.cpuOvercommit,
    memory_overcommit: config.placement.memoryOvercommit,
    memory_reserve_percent: config.placement.memoryReservePercent,
    desktop_expected_mb: config.placement.desktopExpectedMb,
  };
}
