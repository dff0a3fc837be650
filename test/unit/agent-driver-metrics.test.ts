import { expect, it } from 'vitest';
import { AgentMetrics } from '../../agent/src/observability.js';
import type { TemplateStats } from '../../agent/src/runtime/driver.js';

it("shows the golden template's state and where new desktops' disks came from in the agent's metrics", async () => {
  const metrics = new AgentMetrics();
  let stats: TemplateStats | null = { state: 'building', cloned: 0, empty: 2 };
  metrics.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [], templates: () => stats } });
  const text = async () => (await metrics.registry.getSingleMetricAsString('canto_agent_desktop_template')) + '\n' + (await metrics.registry.getSingleMetricAsString('canto_agent_new_desktop_disks_total'));
  expect(await text()).toMatch(/state="ready"} 0\n[^]*state="building"} 1\n[^]*state="none"} 0\n[^]*from="template"} 0\n[^]*from="empty"} 2/);
  stats = { state: 'ready', cloned: 5, empty: 2 };
  expect(await text()).toMatch(/state="ready"} 1\n[^]*state="building"} 0\n[^]*state="none"} 0\n[^]*from="template"} 5\n[^]*from="empty"} 2/);
  // A driver without templates (or with them off) exports neither.
  stats = null;
  const none = new AgentMetrics();
  none.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [], templates: () => stats } });
  expect(await none.registry.getSingleMetricAsString('canto_agent_desktop_template')).not.toMatch(/state=/);
});

it("counts restores by outcome in the agent's metrics, so that failing restores (memory lost) can page someone", async () => {
  const metrics = new AgentMetrics();
  let counts = { restored: 12, failed: 0 };
  metrics.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [], restores: () => counts } });
  const text = () => metrics.registry.getSingleMetricAsString('canto_agent_restores_total');
  expect(await text()).toMatch(/outcome="restored"} 12\n[^]*outcome="failed"} 0/);
  counts = { restored: 13, failed: 2 };
  expect(await text()).toMatch(/outcome="restored"} 13\n[^]*outcome="failed"} 2/);
  // The fake driver restores nothing: no series.
  const none = new AgentMetrics();
  none.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [] } });
  expect(await none.registry.getSingleMetricAsString('canto_agent_restores_total')).not.toMatch(/outcome=/);
});

it("counts hibernates by outcome in the agent's metrics: those that lost the desktop's programs show", async () => {
  const metrics = new AgentMetrics();
  let counts = { memory: 7, cold: 0, refused: 0 };
  metrics.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [], hibernates: () => counts } });
  const text = () => metrics.registry.getSingleMetricAsString('canto_agent_hibernates_total');
  expect(await text()).toMatch(/outcome="memory"} 7\n[^]*outcome="cold"} 0\n[^]*outcome="refused"} 0/);
  counts = { memory: 8, cold: 2, refused: 1 };
  expect(await text()).toMatch(/outcome="memory"} 8\n[^]*outcome="cold"} 2\n[^]*outcome="refused"} 1/);
  const none = new AgentMetrics();
  none.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [] } });
  expect(await none.registry.getSingleMetricAsString('canto_agent_hibernates_total')).not.toMatch(/outcome=/);
});

it("shows who carries the host's port links, relays or the agent, in all and open now", async () => {
  const metrics = new AgentMetrics();
  let stats = { relayed: 40, relayedOpen: 3, agent: 2, agentOpen: 1 };
  metrics.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [] }, portLinks: () => stats });
  const text = async () => (await metrics.registry.getSingleMetricAsString('canto_agent_port_links_total')) + '\n' + (await metrics.registry.getSingleMetricAsString('canto_agent_port_links'));
  expect(await text()).toMatch(/_total{via="relay"} 40\n[^]*_total{via="agent"} 2\n[^]*links{via="relay"} 3\n[^]*links{via="agent"} 1/);
  stats = { relayed: 41, relayedOpen: 0, agent: 2, agentOpen: 0 };
  expect(await text()).toMatch(/_total{via="relay"} 41\n[^]*links{via="relay"} 0\n[^]*links{via="agent"} 0/);
  // An agent without a port gateway exports neither.
  const none = new AgentMetrics();
  none.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [] } });
  expect(await none.registry.getSingleMetricAsString('canto_agent_port_links')).not.toMatch(/via=/);
});
