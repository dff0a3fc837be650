/**
 * What the agent says in every hello: protocol, host id and agent instance id, capabilities,
 * capacity, the desktops it holds with the generations fenced here, and where its port gateway
 * and its transfer server listen. Built afresh for each link, so a replica learns the host as it
 * is now.
 */
import { availableParallelism, hostname, totalmem } from 'node:os';
import { PROTOCOL_VERSION, type HelloPayload } from '../../shared/src/protocol.js';
import type { GenerationStore } from './generations.js';
import type { HostIdentity } from './host-identity.js';
import type { RuntimeDriver } from './runtime/driver.js';

export interface HelloSources {
  readonly driver: RuntimeDriver;
  readonly identity: HostIdentity;
  readonly generations: GenerationStore;
  /** The port gateway's address; null when it is turned off. */
  readonly ingress: { readonly host: string; readonly port: number } | null;
  /** The transfer server's address (1.8); null when it is turned off. */
  readonly transfer?: { readonly host: string; readonly port: number } | null;
  /** The version to announce; this build's PROTOCOL_VERSION unless told otherwise. */
  readonly protocol?: string;
}

export async function buildHello(sources: HelloSources): Promise<HelloPayload> {
  const { driver, identity, generations, ingress, transfer = null, protocol = PROTOCOL_VERSION } = sources;
  const capabilities = driver.capabilities();
  const desktops = await driver.list();
  return {
    protocol,
    host_id: identity.hostId,
    host_key: identity.hostKey,
    agent_instance_id: identity.agentInstanceId,
    hostname: hostname(),
    capabilities: { runtime: capabilities.runtime, memory_snapshots: capabilities.memorySnapshots },
    capacity: { vcpus: availableParallelism(), memory_mb: Math.floor(totalmem() / (1024 * 1024)) },
    desktops: desktops.map((d) => ({
      desktop_id: d.desktopId,
      generation: generations.get(d.desktopId) ?? 0,
      running: d.running,
      has_snapshot: d.hasSnapshot,
    })),
    ...(ingress === null ? {} : { ingress: { host: ingress.host, port: ingress.port } }),
    ...(transfer === null ? {} : { transfer: { host: transfer.host, port: transfer.port } }),
  };
}
