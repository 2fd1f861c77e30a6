// Each pool's engines as the proxies' latency predictors see them: predicted vs observed time to first
// token (TTFT) and time per output token (TPOT) of the last answered stream, and the predictors' error
// (MAPE over recent predictions). The predicted scorers (predicted_latency, slo_cost) use an engine only
// once it is warm; until then they route as least outstanding does.
import { useEffect, useState } from "react";
import type { EnginePrediction, PoolPredictions } from "../../api/types";
import { Card, ErrorState } from "../../components/Page";
import { Table } from "../../components/Table";
import { formatNumber, formatSeconds } from "../../format";
import { useApi } from "../../hooks/useApi";

const REFRESH_MS = 5000;

function pct(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : `${value.toFixed(1)}%`;
}

function pair(predicted: number | null | undefined, observed: number | null | undefined): string {
  return `${formatSeconds(predicted)} / ${formatSeconds(observed)}`;
}

export function PredictionsCard() {
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const timer = window.setInterval(() => setTick((t) => t + 1), REFRESH_MS);
    return () => window.clearInterval(timer);
  }, []);
  const predictions = useApi<PoolPredictions[]>("/api/routing/predictions/", { tick });
  const pools = (predictions.data ?? []).filter((p) => p.engines.length > 0);
  return (
    <Card title="Predicted vs observed latency" testId="predictions-card">
      <ErrorState error={predictions.error} onRetry={predictions.reload} />
      {predictions.data && pools.length === 0 && <p className="muted">No ready engines.</p>}
      {pools.map((pool) => (
        <div key={pool.pool} className="traffic-pool" data-testid={`predictions-pool-${pool.pool}`}>
          <h3>
            {pool.pool} <span className="muted">scorer {pool.scorer}</span>
          </h3>
          <Table<EnginePrediction>
            testId={`predictions-table-${pool.pool}`}
            rows={pool.engines}
            rowKey={(e) => e.deployment_id}
            columns={[
              { header: "Engine", cell: (e) => e.deployment, wrap: true },
              { header: "Samples", cell: (e) => `${formatNumber(e.samples)}${e.warm ? "" : " (cold)"}` },
              { header: "TTFT predicted / observed", cell: (e) => pair(e.ttft_predicted_s, e.ttft_observed_s) },
              { header: "TTFT error", cell: (e) => pct(e.ttft_mape_pct) },
              { header: "TPOT predicted / observed", cell: (e) => pair(e.tpot_predicted_s, e.tpot_observed_s), priority: 1 },
              { header: "TPOT error", cell: (e) => pct(e.tpot_mape_pct), priority: 1 },
              {
                header: "Peak output tok/s",
                cell: (e) => (e.peak_tokens_per_s ? formatNumber(Math.round(e.peak_tokens_per_s)) : "—"),
                priority: 2,
              },
            ]}
          />
        </div>
      ))}
    </Card>
  );
}
