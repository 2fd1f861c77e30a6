// The fleet's history on the dashboard: every GPU's utilization, memory, temperature and power and every
// engine's throughput and queue over the dashboard's window, from the rollups beat keeps (GET
// /api/history/). Past MAX_LINES GPUs or engines a chart draws their max, mean and min instead of a tangle.
import { useMemo } from "react";
import type { Deployment, Host } from "../../api/types";
import { fmt, GIB_SCALE, HistoryChart, type HistoryLine } from "../../components/HistoryChart";
import { Card, ErrorState } from "../../components/Page";
import { RangePicker, type RangeKey } from "../../components/RangePicker";
import { useHistory } from "../../hooks/useHistory";

// One request asks for at most 64 subjects (the API's limit): the first 32 GPUs and 32 engines.
const MAX_EACH = 32;

// GPU utilization is drawn as a moving average over this long (10 s points are still jumpy).
const UTIL_SMOOTH_SECONDS = 60;

export function FleetHistory({ hosts, deployments, range, onRange }: { hosts: Host[]; deployments: Deployment[]; range: RangeKey; onRange: (key: RangeKey) => void }) {
  const gpus = useMemo(
    () => hosts.flatMap((h) => h.gpus.map((g) => `gpu:${h.name}:${g.index}`)).slice(0, MAX_EACH),
    [hosts],
  );
  const engines = useMemo(() => deployments.map((d) => `engine:${d.id}`).slice(0, MAX_EACH), [deployments]);
  const subjects = useMemo(() => [...gpus, ...engines], [gpus, engines]);
  const history = useHistory(subjects, range);
  const lines = useMemo(() => {
    const of = (subjects: string[], field: string, scale?: number): HistoryLine[] => subjects.map((subject) => ({ subject, field, scale }));
    return {
      util: of(gpus, "utilization_pct"),
      memory: of(gpus, "memory_used_bytes", GIB_SCALE),
      temperature: of(gpus, "temperature_c"),
      power: of(gpus, "power_watts"),
      tps: of(engines, "tokens_per_s"),
      waiting: of(engines, "num_requests_waiting"),
    };
  }, [gpus, engines]);
  const h = history.data;
  return (
    <Card title="History" testId="fleet-history" actions={<RangePicker value={range} onChange={onRange} />}>
      <ErrorState error={history.error} onRetry={history.reload} />
      {subjects.length === 0 && <p className="muted">No GPUs or deployments yet.</p>}
      {h && (
        <p className="muted" data-testid="fleet-history-resolution">
          One point per {h.resolution_s >= 3600 ? "hour" : h.resolution_s >= 60 ? "minute" : `${h.resolution_s} s`} (means over it), kept
          by beat in the database.
        </p>
      )}
      {subjects.length > 0 && (
        <div className="chart-grid">
          <HistoryChart
            history={h}
            lines={lines.util}
            title="GPU utilization"
            unit="%"
            format={fmt.percent}
            range={[0, 100]}
            testId="history-gpu-util"
            smoothSeconds={UTIL_SMOOTH_SECONDS}
            what="GPUs"
          />
          <HistoryChart history={h} lines={lines.memory} title="GPU memory used" unit="GiB" format={fmt.gib} testId="history-gpu-mem" what="GPUs" />
          <HistoryChart history={h} lines={lines.temperature} title="GPU temperature" unit="°C" format={fmt.celsius} testId="history-gpu-temp" what="GPUs" />
          <HistoryChart history={h} lines={lines.power} title="GPU power" unit="W" format={fmt.watts} testId="history-gpu-power" what="GPUs" />
          <HistoryChart history={h} lines={lines.tps} title="Engine throughput" unit="tokens/s" format={fmt.tokensPerS} testId="history-engine-tps" what="engines" />
          <HistoryChart history={h} lines={lines.waiting} title="Requests waiting in engines" unit="requests" format={fmt.count} testId="history-engine-waiting" what="engines" />
        </div>
      )}
    </Card>
  );
}
