import { useEffect, useState } from "react";
import { Link } from "react-router-dom";
import type { FleetSummary } from "../../api/types";
import { ChartSync, ZoomBar } from "../../components/chartSync";
import { Card, ErrorState, Page } from "../../components/Page";
import type { RangeKey } from "../../components/RangePicker";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatBytes, formatPct, formatSeconds } from "../../format";
import { EngineThroughputChart, GpuMemoryChart, GpuUtilizationChart } from "../nodes/charts";
import "../nodes/nodes.css";
import { liveFigure, NOT_REPORTED } from "../nodes/engineKind";
import { useFleet } from "../nodes/useFleet";
import { gpuKey, median } from "../nodes/useFleetLive";
import { useApi } from "../../hooks/useApi";
import { FleetHistory } from "./FleetHistory";
import { HealthPanel } from "./HealthPanel";
import { LiveLinesChart } from "./LiveLinesChart";

// Up to this many GPUs and engines each, every one gets its tile; past it the dashboard summarises (per
// pool, the busiest and hottest) and the Nodes page pages through the rest.
const DRAW_ALL_UP_TO = 24;
// Up to this many, each GPU and engine also gets charts of its own; past it one chart draws them all
// (one line each, or their max, mean and min past the palette's eight colours).
const CHART_EACH_UP_TO = 4;
const SUMMARY_REFRESH_MS = 5000;

/** The fleet at a glance: its health first (requests, errors, latency, hosts down), then totals and pools;
 * every GPU and engine live when the fleet is small, the busiest and hottest when it is not (a fleet of
 * thousands cannot be drawn chart by chart). Every chart shares one time range: zoom one, zoom all. */
export function DashboardPage() {
  const [range, setRange] = useState<RangeKey>("1h");
  const summary = useApi<FleetSummary>("/api/fleet/summary/", { top: 10 });
  const { reload: reloadSummary } = summary;
  useEffect(() => {
    const timer = window.setInterval(reloadSummary, SUMMARY_REFRESH_MS);
    return () => window.clearInterval(timer);
  }, [reloadSummary]);
  const { hosts, deployments, live } = useFleet({ limit: DRAW_ALL_UP_TO }, { limit: DRAW_ALL_UP_TO });
  const big = summary.data !== undefined && (summary.data.gpus.total > DRAW_ALL_UP_TO || summary.data.deployments.total > DRAW_ALL_UP_TO);
  const latency = median(live.latenciesMs);
  const gpus = (hosts.data?.results ?? []).flatMap((h) => h.gpus.map((gpu) => ({ host: h.name, gpu })));
  const anySimulated = gpus.some(({ gpu }) => gpu.simulated);
  const readyOnPage = deployments.data?.results.filter((d) => (live.engines[d.id]?.state ?? d.state) === "ready").length ?? 0;
  const ready = summary.data?.deployments.by_state.ready ?? readyOnPage;
  const down = summary.data?.hosts.down;
  const tokensPerS = Object.values(live.engines).reduce((sum, e) => sum + (e.tokens_per_s || 0), 0);
  const running = Object.values(live.engines).reduce((sum, e) => sum + (e.num_requests_running || 0), 0);
  const chartEach = gpus.length <= CHART_EACH_UP_TO;
  const engineList = deployments.data?.results ?? [];

  return (
    <Page
      title="Dashboard"
      subtitle="Is the fleet serving? Requests, errors and latency first; then GPUs and engines, live from the node agents."
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
      <ChartSync syncKey="dashboard">
      <ZoomBar />
      <HealthPanel range={range} onRange={setRange} />
      <div style={{ height: 16 }} />
      <ErrorState error={summary.error || hosts.error || deployments.error} onRetry={() => (summary.reload(), hosts.reload(), deployments.reload())} />
      {anySimulated && (
        <div className="notice notice-info" data-testid="simulated-notice">
          <strong>Simulated GPUs.</strong> Hosts without an NVIDIA GPU report the GPU that the vLLM simulator models;
          their values are marked <em>simulated</em>.
        </div>
      )}
      <div className="grid-3">
        <Card title="Hosts">
          <div className="stat" data-testid="stat-hosts">
            {summary.data ? summary.data.hosts.total - summary.data.hosts.down.count : "—"} / {summary.data?.hosts.total ?? "—"} online
          </div>
          {down && down.count > 0 && (
            <div className="text-bad" data-testid="stat-hosts-down">
              {down.count} down: named in red under Health, each linked to its alert
            </div>
          )}
        </Card>
        <Card title="Engines">
          <div className="stat" data-testid="stat-engines">
            {ready} / {summary.data?.deployments.total ?? deployments.data?.count ?? "—"} ready · {running.toFixed(0)} running requests
          </div>
        </Card>
        <Card title="Throughput">
          <div className="stat" data-testid="stat-throughput">
            {tokensPerS.toFixed(0)} tokens/s
          </div>
        </Card>
      </div>
      <div style={{ height: 16 }} />
      <Card title="Pools" testId="pools-card">
        <Table
          testId="pools-table"
          rows={summary.data?.pools}
          loading={summary.loading}
          rowKey={(p) => p.served_model_name}
          empty="No deployments yet."
          columns={[
            { header: "Serves as", cell: (p) => <Link to={`/nodes?q=${encodeURIComponent(p.served_model_name)}`}><code>{p.served_model_name}</code></Link> },
            { header: "Ready", className: "num", cell: (p) => `${p.ready} / ${p.engines}` },
            { header: "Running", className: "num", cell: (p) => p.running },
            { header: "Waiting", className: "num", cell: (p) => p.waiting },
            { header: "Tokens/s", className: "num", cell: (p) => p.tokens_per_s.toFixed(0) },
            {
              header: "KV cache mean (max)",
              className: "num",
              // Engines that report (a live record) yet none with a KV cache: llama.cpp serves no metrics.
              cell: (p) =>
                p.kv_cache_usage_mean === null
                  ? p.reporting > 0
                    ? NOT_REPORTED
                    : "—"
                  : `${formatPct(p.kv_cache_usage_mean)} (${formatPct(p.kv_cache_usage_max)})`,
            },
          ]}
        />
      </Card>
      <div style={{ height: 16 }} />
      {big && summary.data && (
        <div className="grid-2">
          <Card title={`Busiest engines (of ${summary.data.deployments.total})`} testId="busiest-card">
            <Table
              testId="busiest-engines"
              rows={summary.data.busiest_engines}
              rowKey={(e) => e.id}
              empty="No engine reports live values."
              columns={[
                { header: "Deployment", cell: (e) => <Link to={`/nodes/deployments/${e.id}`}>{e.name}</Link> },
                { header: "Host", cell: (e) => e.host_name },
                { header: "KV cache", className: "num", cell: (e) => (e.has_metrics ? formatPct(e.kv_cache_usage_perc) : NOT_REPORTED) },
                { header: "Waiting", className: "num", cell: (e) => (e.has_metrics ? e.num_requests_waiting : NOT_REPORTED) },
                { header: "Tokens/s", className: "num", cell: (e) => (e.has_metrics ? e.tokens_per_s.toFixed(0) : NOT_REPORTED) },
              ]}
            />
          </Card>
          <Card title={`Hottest GPUs (of ${summary.data.gpus.total})`} testId="hottest-card">
            <Table
              testId="hottest-gpus"
              rows={summary.data.hottest_gpus}
              rowKey={(g) => `${g.host_name}:${g.index}`}
              empty="No GPU reports live values."
              columns={[
                { header: "GPU", cell: (g) => <Link to={`/nodes?hq=${encodeURIComponent(g.host_name)}`}>{`${g.host_name} · GPU ${g.index}`}</Link> },
                { header: "Util", className: "num", cell: (g) => `${g.utilization_pct.toFixed(0)}%` },
                { header: "Memory", className: "num", cell: (g) => `${formatBytes(g.memory_used_bytes)} / ${formatBytes(g.memory_total_bytes)}` },
                { header: "Temp", className: "num", cell: (g) => (g.temperature_c === null ? "—" : `${g.temperature_c.toFixed(0)} °C`) },
              ]}
            />
          </Card>
        </div>
      )}
      {!big && (
      <>
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
                {chartEach && (
                  <>
                    <GpuUtilizationChart series={live.series.gpus[key]} testId={`gpu-util-${key}`} />
                    <GpuMemoryChart series={live.series.gpus[key]} totalBytes={gpu.memory_total_bytes} testId={`gpu-mem-${key}`} />
                  </>
                )}
              </div>
            );
          })}
        </div>
        {!chartEach && (
          <div className="chart-grid">
            <LiveLinesChart
              title="GPU utilization"
              unit="%"
              format={(v) => `${Number(v.toFixed(1))}%`}
              range={[0, 100]}
              smoothSeconds={15}
              what="GPUs"
              testId="gpus-util"
              lines={gpus.map(({ host, gpu }) => {
                const g = live.series.gpus[gpuKey(host, gpu)];
                return { label: `${host} GPU ${gpu.index}`, t: g?.t, values: g?.utilization_pct };
              })}
            />
            <LiveLinesChart
              title="GPU memory used"
              unit="GiB"
              format={(v) => `${Number(v.toFixed(v >= 10 ? 0 : 1))} GiB`}
              scale={1 / 1024 ** 3}
              what="GPUs"
              testId="gpus-mem"
              lines={gpus.map(({ host, gpu }) => {
                const g = live.series.gpus[gpuKey(host, gpu)];
                return { label: `${host} GPU ${gpu.index}`, t: g?.t, values: g?.memory_used_bytes };
              })}
            />
          </div>
        )}
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
            { header: "Deployment", wrap: true, cell: (d) => <Link to={`/nodes/deployments/${d.id}`}>{d.name}</Link> },
            { header: "Host", cell: (d) => d.host_name },
            { header: "Role", wrap: true, cell: (d) => d.role || <span className="muted">—</span> },
            // The live state (from the agent's last tick) wins over the state the page loaded with.
            { header: "State", cell: (d) => <StatusBadge status={live.engines[d.id]?.state ?? d.state} /> },
            { header: "Running", className: "num", cell: (d) => liveFigure(live.engines[d.id] ?? d.live, (e) => e.num_requests_running, (v) => String(v ?? "—")) },
            { header: "Waiting", className: "num", cell: (d) => liveFigure(live.engines[d.id] ?? d.live, (e) => e.num_requests_waiting, (v) => String(v ?? "—")) },
            {
              header: "KV cache",
              className: "num",
              cell: (d) => <span data-testid={`dash-kv-${d.id}`}>{liveFigure(live.engines[d.id] ?? d.live, (e) => e.kv_cache_usage_perc, formatPct)}</span>,
            },
            {
              header: "Tokens/s",
              className: "num",
              cell: (d) => <span data-testid={`tps-${d.id}`}>{liveFigure(live.engines[d.id] ?? d.live, (e) => e.tokens_per_s, (v) => (v ?? 0).toFixed(0))}</span>,
            },
            { header: "TTFT p50", className: "num", cell: (d) => liveFigure(live.engines[d.id] ?? d.live, (e) => e.ttft_p50_s, formatSeconds) },
            { header: "ITL p50", className: "num", cell: (d) => liveFigure(live.engines[d.id] ?? d.live, (e) => e.itl_p50_s, formatSeconds) },
          ]}
        />
      </Card>
      <Card title="Engine throughput" testId="engine-charts">
        {engineList.length === 0 && <p className="muted">No deployments yet.</p>}
        {engineList.length > 0 && engineList.length <= CHART_EACH_UP_TO && (
          <div className="chart-grid">
            {engineList.map((d) => (
              <EngineThroughputChart key={d.id} title={`${d.name} on ${d.host_name}`} series={live.series.engines[d.id]} testId={`engine-tps-${d.id}`} />
            ))}
          </div>
        )}
        {engineList.length > CHART_EACH_UP_TO && (
          <LiveLinesChart
            title="Generated tokens/s"
            unit="tokens/s"
            format={(v) => `${Number(v.toFixed(v >= 10 ? 0 : 1))} tok/s`}
            what="engines"
            testId="engines-tps"
            lines={engineList.map((d) => ({ label: `${d.name} on ${d.host_name}`, t: live.series.engines[d.id]?.t, values: live.series.engines[d.id]?.tokens_per_s }))}
          />
        )}
      </Card>
      </>
      )}
      <div style={{ height: 16 }} />
      <FleetHistory hosts={hosts.data?.results ?? []} deployments={deployments.data?.results ?? []} range={range} onRange={setRange} />
      </ChartSync>
    </Page>
  );
}
