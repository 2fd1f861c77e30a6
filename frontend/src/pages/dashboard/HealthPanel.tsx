// The dashboard's first card: is the fleet serving? Request rate, error rate (4xx and 5xx apart), p50/p99
// latency and time to first token for the fleet and each pool over the dashboard's window, and the hosts
// down, named in red, each a link to its alert. One answer, GET /api/fleet/health/, from the rollups beat
// keeps. Errors are coloured against the alert rule's threshold (InferchainHigh5xxRatio): an hour with 28 %
// errors is a red banner and a red tile, never a calm number.
import { useEffect, useMemo } from "react";
import { Link } from "react-router-dom";
import type { FleetHealth, HealthDownHost, HealthFigures, PoolHealth } from "../../api/types";
import { Card, ErrorState } from "../../components/Page";
import { RangePicker, rangeSeconds, type RangeKey } from "../../components/RangePicker";
import { Table } from "../../components/Table";
import { PALETTE, TimeChart, windowLabel, type ChartSeries } from "../../components/TimeChart";
import { formatDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import "./dashboard.css";

type Tone = "ok" | "warn" | "bad" | "off";

export function pct(fraction: number | null | undefined): string {
  if (fraction === null || fraction === undefined) return "—";
  const value = fraction * 100;
  return `${value.toFixed(value >= 10 || value === 0 ? 0 : 1)}%`;
}

export function ms(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  return value < 1000 ? `${value.toFixed(value >= 10 ? 0 : 1)} ms` : `${(value / 1000).toFixed(2)} s`;
}

export function perSecond(value: number): string {
  return `${value.toFixed(value >= 10 ? 0 : 2)} req/s`;
}

function errorTone(rate: number | null | undefined, thresholds: FleetHealth["thresholds"]): Tone {
  if (rate === null || rate === undefined) return "off";
  if (rate >= thresholds.error_rate_critical) return "bad";
  if (rate >= thresholds.error_rate_warn) return "warn";
  return "ok";
}

function Tile({ label, value, detail, tone, testId }: { label: string; value: string; detail?: string; tone?: Tone; testId: string }) {
  return (
    <div className={`health-tile health-tile-${tone ?? "plain"}`} data-testid={testId} data-tone={tone ?? "plain"}>
      <div className="health-tile-label">{label}</div>
      <div className="health-tile-value" data-testid={`${testId}-value`}>
        {value}
      </div>
      {detail && (
        <div className="health-tile-detail" data-testid={`${testId}-detail`}>
          {detail}
        </div>
      )}
    </div>
  );
}

function clock(iso: string | null | undefined): string {
  return iso ? formatDateTime(iso) : "never";
}

/** A host down: its name in red, a link to its InferchainHostDown alert (the Nodes page until one exists). */
function DownHost({ host }: { host: HealthDownHost }) {
  const alert = host.alert;
  return (
    <span className="host-down" data-testid={`host-down-${host.name}`}>
      <Link to={alert ? `/alerts?alert=${alert.id}` : `/nodes?hq=${encodeURIComponent(host.name)}`} data-alert={alert?.id ?? ""}>
        {host.name}
      </Link>{" "}
      <span className="muted">
        {alert
          ? `(alert ${alert.state}${alert.fired_at ? ` since ${clock(alert.fired_at)}` : ""})`
          : `(no alert yet; last heartbeat ${clock(host.last_heartbeat)})`}
      </span>
    </span>
  );
}

function errorsCell(p: HealthFigures, thresholds: FleetHealth["thresholds"]) {
  const tone = errorTone(p.error_rate, thresholds);
  return (
    <span className={`health-rate health-rate-${tone}`} data-tone={tone} data-testid="pool-error-rate">
      {pct(p.error_rate)}
    </span>
  );
}

export function HealthPanel({ range, onRange }: { range: RangeKey; onRange: (key: RangeKey) => void }) {
  const health = useApi<FleetHealth>("/api/fleet/health/", { window: range });
  const { reload } = health;
  const every = (health.data?.resolution_s ?? 10) * 1000;
  useEffect(() => {
    const timer = window.setInterval(reload, every);
    return () => window.clearInterval(timer);
  }, [every, reload]);
  const h = health.data;
  const charts = useMemo(() => {
    if (!h) return null;
    const s = h.series;
    const scaled = (values: (number | null)[] | undefined, by: number) => (values ?? []).map((v) => (v === null ? null : v * by));
    const threshold = h.t.map(() => h.thresholds.error_rate_critical * 100);
    return {
      requests: [{ label: "requests/s", values: s.requests_per_s ?? [], color: PALETTE[0] }] as ChartSeries[],
      errors: [
        { label: "5xx", values: scaled(s.error_rate_5xx, 100), color: PALETTE[3] },
        { label: "4xx", values: scaled(s.error_rate_4xx, 100), color: PALETTE[1] },
        { label: "alert threshold", values: threshold, color: PALETTE[6], dash: [4, 4] },
      ] as ChartSeries[],
      latency: [
        { label: "p50", values: s.latency_p50_ms ?? [], color: PALETTE[0] },
        { label: "p99", values: s.latency_p99_ms ?? [], color: PALETTE[3] },
      ] as ChartSeries[],
      ttft: [
        { label: "p50", values: s.ttft_p50_ms ?? [], color: PALETTE[0] },
        { label: "p99", values: s.ttft_p99_ms ?? [], color: PALETTE[3] },
      ] as ChartSeries[],
    };
  }, [h]);
  const fleet = h?.fleet;
  const tone = h && fleet ? errorTone(fleet.error_rate, h.thresholds) : "off";
  const down = h?.hosts_down;
  const windowSeconds = h ? h.end - h.start : rangeSeconds(range);
  const span = windowLabel(windowSeconds);
  return (
    <Card title="Health" testId="health-card" actions={<RangePicker value={range} onChange={onRange} testId="health-window" />}>
      <ErrorState error={health.error} onRetry={health.reload} />
      {h && fleet && tone === "bad" && (
        <div className="notice notice-bad health-alarm" role="alert" data-testid="health-alarm">
          <strong>
            {pct(fleet.error_rate)} of requests failed over the {span}
          </strong>
          (4xx {pct(fleet.error_rate_4xx)}, 5xx {pct(fleet.error_rate_5xx)}): above the {pct(h.thresholds.error_rate_critical)} at which
          InferchainHigh5xxRatio fires. <Link to="/requests">Open the request log</Link>
        </div>
      )}
      {down && down.count > 0 && (
        <div className="notice notice-bad hosts-down" data-testid="hosts-down">
          <strong>
            {down.count} {down.count === 1 ? "host" : "hosts"} down:
          </strong>
          {down.hosts.map((host, i) => (
            <span key={host.name}>
              {i > 0 && ", "}
              <DownHost host={host} />
            </span>
          ))}
          {down.count > down.hosts.length && (
            <>
              {" "}
              and <Link to="/nodes?hstate=down">{down.count - down.hosts.length} more</Link>
            </>
          )}
        </div>
      )}
      <div className="health-tiles">
        <Tile
          label="Requests"
          testId="health-requests"
          value={fleet ? perSecond(fleet.requests_per_s) : "—"}
          detail={fleet ? `${fleet.requests.toLocaleString()} requests, ${span}` : undefined}
        />
        <Tile
          label="Error rate"
          testId="health-errors"
          tone={tone}
          value={fleet ? pct(fleet.error_rate) : "—"}
          detail={fleet ? `4xx ${pct(fleet.error_rate_4xx)} · 5xx ${pct(fleet.error_rate_5xx)}` : undefined}
        />
        <Tile label="Latency" testId="health-latency" value={fleet ? `p50 ${ms(fleet.latency_p50_ms)}` : "—"} detail={fleet ? `p99 ${ms(fleet.latency_p99_ms)}` : undefined} />
        <Tile label="Time to first token" testId="health-ttft" value={fleet ? `p50 ${ms(fleet.ttft_p50_ms)}` : "—"} detail={fleet ? `p99 ${ms(fleet.ttft_p99_ms)}` : undefined} />
        <Tile
          label="Hosts down"
          testId="health-hosts"
          tone={down ? (down.count > 0 ? "bad" : "ok") : undefined}
          value={down ? String(down.count) : "—"}
          detail={down && down.count === 0 ? "every host sends heartbeats" : undefined}
        />
      </div>
      {h && charts && (
        <div className="chart-grid">
          <TimeChart title="Requests" unit="requests/s" format={perSecond} t={h.t} series={charts.requests} windowSeconds={windowSeconds} end={h.end} height={130} testId="health-chart-requests" />
          <TimeChart
            title="Errors (share of requests)"
            unit="%"
            format={(v) => `${Number(v.toFixed(1))}%`}
            t={h.t}
            series={charts.errors}
            windowSeconds={windowSeconds}
            end={h.end}
            height={130}
            testId="health-chart-errors"
          />
          <TimeChart title="Latency" unit="ms" format={ms} t={h.t} series={charts.latency} windowSeconds={windowSeconds} end={h.end} height={130} testId="health-chart-latency" />
          <TimeChart title="Time to first token" unit="ms" format={ms} t={h.t} series={charts.ttft} windowSeconds={windowSeconds} end={h.end} height={130} testId="health-chart-ttft" />
        </div>
      )}
      <div style={{ height: 12 }} />
      <Table<PoolHealth>
        testId="health-pools"
        rows={h?.pools}
        loading={health.loading && !h}
        rowKey={(p) => p.name}
        empty="No route pool has served a request in this window."
        columns={[
          { header: "Pool", cell: (p) => <code>{p.name}</code> },
          { header: "Requests/s", className: "num", cell: (p) => perSecond(p.requests_per_s) },
          { header: "Errors", className: "num", cell: (p) => (h ? errorsCell(p, h.thresholds) : pct(p.error_rate)) },
          { header: "4xx / 5xx", className: "num", cell: (p) => `${pct(p.error_rate_4xx)} / ${pct(p.error_rate_5xx)}` },
          { header: "Latency p50 / p99", className: "num", cell: (p) => `${ms(p.latency_p50_ms)} / ${ms(p.latency_p99_ms)}` },
          { header: "TTFT p50 / p99", className: "num", cell: (p) => `${ms(p.ttft_p50_ms)} / ${ms(p.ttft_p99_ms)}` },
        ]}
      />
      {h && (
        <p className="muted health-footnote" data-testid="health-known-until">
          Rolled up to {new Date(h.known_until * 1000).toLocaleTimeString(undefined, { hour12: false })} (the history lags the proxy by about 20 s). Percentiles
          from the rollups' histograms, within 19 %; errors are answers other than 2xx, coloured from {pct(h.thresholds.error_rate_warn)} and red from the alert's{" "}
          {pct(h.thresholds.error_rate_critical)}. Requests refused before a pool was chosen (bad key, unknown model) are not counted here: see the request log.
        </p>
      )}
    </Card>
  );
}
