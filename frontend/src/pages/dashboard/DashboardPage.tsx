import { Link } from "react-router-dom";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatBytes, formatPct, formatSeconds } from "../../format";
import { EngineThroughputChart, GpuMemoryChart, GpuUtilizationChart } from "../nodes/charts";
import "../nodes/nodes.css";
import { useFleet } from "../nodes/useFleet";
import { gpuKey, median } from "../nodes/useFleetLive";
import { FleetHistory } from "./FleetHistory";

/** The fleet at a glance: every GPU and engine, updated live from the node agents (about once a second). */
export function DashboardPage() {
  const { hosts, deployments, live } = useFleet();
  const latency = median(live.latenciesMs);
  const gpus = (hosts.data?.results ?? []).flatMap((h) => h.gpus.map((gpu) => ({ host: h.name, gpu })));
  const anySimulated = gpus.some(({ gpu }) => gpu.simulated);
  const ready = deployments.data?.results.filter((d) => (live.engines[d.id]?.state ?? d.state) === "ready").length ?? 0;
  const tokensPerS = Object.values(live.engines).reduce((sum, e) => sum + (e.tokens_per_s || 0), 0);
  const running = Object.values(live.engines).reduce((sum, e) => sum + (e.num_requests_running || 0), 0);

  return (
    <Page
      title="Dashboard"
      subtitle="GPUs and engines across the fleet, live from the node agents."
      actions={
        <span className={live.connected ? "live live-on" : "live"} data-testid="live-status">
          {live.connected ? "live" : "connecting…"}
          {latency !== null && (
            <span className="muted" data-testid="feed-latency" data-ms={latency.toFixed(1)}>
              {" "}
              · sample→browser {latency.toFixed(0)} ms
            </span>
          )}
        </span>
      }
    >
      <ErrorState error={hosts.error || deployments.error} onRetry={() => (hosts.reload(), deployments.reload())} />
      {anySimulated && (
        <div className="notice notice-info" data-testid="simulated-notice">
          <strong>Simulated GPUs.</strong> Hosts without an NVIDIA GPU report the GPU that the vLLM simulator models;
          their values are marked <em>simulated</em>.
        </div>
      )}
      <div className="grid-3">
        <Card title="Hosts">
          <div className="stat" data-testid="stat-hosts">
            {hosts.data?.results.filter((h) => h.reachable).length ?? "—"} / {hosts.data?.count ?? "—"} online
          </div>
        </Card>
        <Card title="Engines">
          <div className="stat" data-testid="stat-engines">
            {ready} / {deployments.data?.count ?? "—"} ready · {running.toFixed(0)} running requests
          </div>
        </Card>
        <Card title="Throughput">
          <div className="stat" data-testid="stat-throughput">
            {tokensPerS.toFixed(0)} tokens/s
          </div>
        </Card>
      </div>
      <div style={{ height: 16 }} />
      <Card title="GPUs" testId="gpu-card">
        {gpus.length === 0 && <p className="muted">No GPUs reported yet: start a node agent.</p>}
        <div className="gpu-grid">
          {gpus.map(({ host, gpu }) => {
            const key = gpuKey(host, gpu);
            // The latest live sample, else the one the page loaded with (the agent's last, if recent).
            const sample = live.hosts[host]?.gpus.find((g) => g.index === gpu.index) ?? gpu.live;
            return (
              <div className="gpu-tile" key={key} data-testid={`gpu-${key}`}>
                <div>
                  <strong>{host}</strong> · GPU {gpu.index} <span className="muted">{gpu.name}</span>{" "}
                  {gpu.simulated && <StatusBadge status="simulated" tone="info" />}
                </div>
                <div className="muted">
                  {sample
                    ? `${sample.utilization_pct.toFixed(0)}% util · ${formatBytes(sample.memory_used_bytes)} / ${formatBytes(gpu.memory_total_bytes)} · ${sample.temperature_c.toFixed(0)} °C · ${sample.power_watts === null ? "—" : `${sample.power_watts.toFixed(0)} W`}`
                    : `${formatBytes(gpu.memory_total_bytes)} · no live sample`}
                </div>
                <GpuUtilizationChart series={live.series.gpus[key]} testId={`gpu-util-${key}`} />
                <GpuMemoryChart series={live.series.gpus[key]} totalBytes={gpu.memory_total_bytes} testId={`gpu-mem-${key}`} />
              </div>
            );
          })}
        </div>
      </Card>
      <div style={{ height: 16 }} />
      <Card title="Engines" testId="engines-card">
        <Table
          testId="engines-table"
          rows={deployments.data?.results}
          loading={deployments.loading}
          rowKey={(d) => d.id}
          empty={
            <>
              No deployments yet. <Link to="/nodes">Deploy a model</Link>.
            </>
          }
          columns={[
            { header: "Deployment", cell: (d) => <Link to={`/nodes/deployments/${d.id}`}>{d.name}</Link> },
            { header: "Host", cell: (d) => d.host_name },
            { header: "Role", cell: (d) => d.role || <span className="muted">—</span> },
            // The live state (from the agent's last tick) wins over the state the page loaded with.
            { header: "State", cell: (d) => <StatusBadge status={live.engines[d.id]?.state ?? d.state} /> },
            { header: "Running", className: "num", cell: (d) => live.engines[d.id]?.num_requests_running ?? "—" },
            { header: "Waiting", className: "num", cell: (d) => live.engines[d.id]?.num_requests_waiting ?? "—" },
            { header: "KV cache", className: "num", cell: (d) => formatPct(live.engines[d.id]?.kv_cache_usage_perc) },
            {
              header: "Tokens/s",
              className: "num",
              cell: (d) => <span data-testid={`tps-${d.id}`}>{live.engines[d.id]?.tokens_per_s.toFixed(0) ?? "—"}</span>,
            },
            { header: "TTFT p50", className: "num", cell: (d) => formatSeconds(live.engines[d.id]?.ttft_p50_s) },
            { header: "ITL p50", className: "num", cell: (d) => formatSeconds(live.engines[d.id]?.itl_p50_s) },
          ]}
        />
      </Card>
      <Card title="Engine throughput" testId="engine-charts">
        {deployments.data?.results.length === 0 && <p className="muted">No deployments yet.</p>}
        <div className="chart-grid">
          {deployments.data?.results.map((d) => (
            <EngineThroughputChart key={d.id} title={`${d.name} on ${d.host_name}`} series={live.series.engines[d.id]} testId={`engine-tps-${d.id}`} />
          ))}
        </div>
      </Card>
      <div style={{ height: 16 }} />
      <FleetHistory hosts={hosts.data?.results ?? []} deployments={deployments.data?.results ?? []} />
    </Page>
  );
}
