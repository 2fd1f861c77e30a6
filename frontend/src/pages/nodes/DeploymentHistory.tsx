// One deployment's history: its engine's load, throughput, KV cache and latency p95s and its GPUs'
// utilization over 15 min, 1 h or 24 h, from the rollups beat keeps (GET /api/history/).
import { useMemo, useState } from "react";
import type { Deployment } from "../../api/types";
import { fmt, HistoryChart } from "../../components/HistoryChart";
import { Card, ErrorState } from "../../components/Page";
import { RangePicker, type RangeKey } from "../../components/RangePicker";
import { useHistory } from "../../hooks/useHistory";
import { engineLabel, NOT_REPORTED, reportsMetrics } from "./engineKind";

export function DeploymentHistory({ deployment }: { deployment: Deployment }) {
  const [range, setRange] = useState<RangeKey>("1h");
  const engine = `engine:${deployment.id}`;
  const gpus = useMemo(() => deployment.gpu_indices.map((i) => `gpu:${deployment.host_name}:${i}`), [deployment.gpu_indices, deployment.host_name]);
  const subjects = useMemo(() => [engine, ...gpus], [engine, gpus]);
  const history = useHistory(subjects, range);
  const lines = useMemo(
    () => ({
      tps: [{ subject: engine, field: "tokens_per_s", label: "generated" }],
      requests: [
        { subject: engine, field: "num_requests_running", label: "running" },
        { subject: engine, field: "num_requests_waiting", label: "waiting", color: "#a86a00" },
      ],
      kv: [{ subject: engine, field: "kv_cache_usage_perc", label: "KV cache used", scale: 100, color: "#1e8a4c" }],
      latency: [
        { subject: engine, field: "ttft_p95_s", label: "TTFT p95", scale: 1000 },
        { subject: engine, field: "itl_p95_s", label: "ITL p95", scale: 1000, color: "#c2372f" },
      ],
      gpus: gpus.map((subject) => ({ subject, field: "utilization_pct" })),
    }),
    [engine, gpus],
  );
  const h = history.data;
  // An engine without metrics (llama.cpp) would chart its zeros as if it idled: say so instead.
  const hasMetrics = reportsMetrics(deployment.engine, deployment.live);
  return (
    <Card title="History" testId="deployment-history" actions={<RangePicker value={range} onChange={setRange} />}>
      <ErrorState error={history.error} onRetry={history.reload} />
      <div className="chart-grid">
        {hasMetrics ? (
          <>
            <HistoryChart history={h} lines={lines.tps} title="Throughput" unit="tokens/s" format={fmt.tokensPerS} testId="dh-tps" />
            <HistoryChart history={h} lines={lines.requests} title="Requests in the engine" unit="requests" format={fmt.count} testId="dh-requests" />
            <HistoryChart history={h} lines={lines.kv} title="KV cache usage" unit="%" format={fmt.percent} range={[0, 100]} testId="dh-kv" />
            <HistoryChart history={h} lines={lines.latency} title="Latency p95 at the engine" unit="ms" format={fmt.ms} testId="dh-latency" />
          </>
        ) : (
          <p className="muted" data-testid="dh-not-reported">
            Engine throughput, requests, KV cache and latency: {NOT_REPORTED} ({engineLabel(deployment.engine)} serves no metrics).
          </p>
        )}
        {gpus.length > 0 && (
          <HistoryChart history={h} lines={lines.gpus} title="GPU utilization" unit="%" format={fmt.percent} range={[0, 100]} testId="dh-gpu" />
        )}
      </div>
    </Card>
  );
}
