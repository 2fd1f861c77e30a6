// A route pool's or a tenant's request history (GET /api/history/): requests, success rate, latency and
// tokens over the range, and for a pool the same split by request kind (short vs long prompts).
import { useMemo } from "react";
import type { History, HistorySeries } from "../api/types";
import { fmt, HistoryChart, type HistoryLine } from "./HistoryChart";

const KINDS = [
  { part: "", label: "all" },
  { part: "short_", label: "short prompts" },
  { part: "long_", label: "long prompts" },
] as const;
const COLORS = { "": "#2f5bd3", short_: "#1e8a4c", long_: "#a86a00" } as const;

function pct(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : `${Number((value * 100).toFixed(1))}%`;
}

function ms(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : fmt.ms(value);
}

/** The range's requests in all: the mean rate times the range (the API gives rates). */
function total(series: HistorySeries, part: string, seconds: number): number {
  return Math.round((series.summary[`${part}requests_per_s`] ?? 0) * seconds);
}

export function RequestHistory({ history, subject, breakdown, testId }: { history: History | undefined; subject: string; breakdown: boolean; testId: string }) {
  const series = history?.series.find((s) => s.subject === subject);
  const seconds = history ? history.end - history.start : 0;
  const kinds = breakdown ? KINDS : KINDS.slice(0, 1);
  const lines = useMemo(() => {
    const of = (field: string, scale?: number): HistoryLine[] =>
      kinds.map((k) => ({ subject, field: `${k.part}${field}`, label: k.label, scale, color: COLORS[k.part] }));
    return {
      requests: of("requests_per_s"),
      success: of("success_rate", 100),
      latency: breakdown
        ? [
            { subject, field: "latency_p50_ms", label: "p50 all", color: "#7a3fc2" },
            ...of("latency_p95_ms").map((line) => ({ ...line, label: `p95 ${line.label}` })),
          ]
        : [
            { subject, field: "latency_p50_ms", label: "p50", color: "#7a3fc2" },
            { subject, field: "latency_p95_ms", label: "p95", color: "#c2372f" },
          ],
      tokens: [
        { subject, field: "prompt_tokens_per_s", label: "prompt" },
        { subject, field: "completion_tokens_per_s", label: "completion", color: "#1e8a4c" },
      ],
    };
  }, [subject, breakdown, kinds]);
  return (
    <>
      {series && (
        <table className="table history-table" data-testid={`${testId}-summary`}>
          <thead>
            <tr>
              <th>Requests {breakdown ? "by kind" : ""}</th>
              <th className="num">requests</th>
              <th className="num">success rate</th>
              <th className="num">latency p50</th>
              <th className="num">latency p95</th>
            </tr>
          </thead>
          <tbody>
            {kinds.map((k) => (
              <tr key={k.part} data-testid={`${testId}-kind-${k.label.split(" ")[0]}`}>
                <td>{k.label}</td>
                <td className="num">{total(series, k.part, seconds)}</td>
                <td className="num">{pct(series.summary[`${k.part}success_rate`])}</td>
                <td className="num">{ms(series.summary[`${k.part}latency_p50_ms`])}</td>
                <td className="num">{ms(series.summary[`${k.part}latency_p95_ms`])}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {breakdown && (
        <p className="muted">
          Long prompts have at least the proxy's PROXY_LONG_PROMPT_TOKENS tokens; a success is a 2xx answer. Latency percentiles are those of all
          the requests in a point (or the range), within 19%.
        </p>
      )}
      <div className="chart-grid">
        <HistoryChart history={history} lines={lines.requests} title="Requests" unit="requests/s" format={fmt.requestsPerS} testId={`${testId}-requests`} />
        <HistoryChart history={history} lines={lines.success} title="Success rate" unit="%" format={fmt.percent} range={[0, 100]} testId={`${testId}-success`} />
        <HistoryChart history={history} lines={lines.latency} title="Latency" unit="ms" format={fmt.ms} testId={`${testId}-latency`} />
        <HistoryChart history={history} lines={lines.tokens} title="Tokens" unit="tokens/s" format={fmt.tokensPerS} testId={`${testId}-tokens`} />
      </div>
    </>
  );
}
