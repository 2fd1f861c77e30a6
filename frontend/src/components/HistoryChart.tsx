// One chart of GET /api/history/'s answer: chosen fields of chosen subjects as lines on the range's time axis.
import { useMemo } from "react";
import type { History } from "../api/types";
import { PALETTE, TimeChart } from "./TimeChart";

export interface HistoryLine {
  /** The subject's name in the answer, e.g. "gpu:demo-a:0", "pool:fast". */
  subject: string;
  field: string;
  /** Legend label; default: the subject's name. */
  label?: string;
  /** Multiplies each value, e.g. 100 for a ratio drawn in %, 1e3 for seconds drawn in ms. */
  scale?: number;
  color?: string;
}

const NO_TIMES: number[] = [];

export function HistoryChart({
  history,
  lines,
  title,
  unit,
  format,
  range,
  height = 150,
  testId,
}: {
  history: History | undefined;
  lines: HistoryLine[];
  title: string;
  unit: string;
  format: (value: number) => string;
  range?: [number, number];
  height?: number;
  testId?: string;
}) {
  const series = useMemo(() => {
    const bySubject = new Map((history?.series ?? []).map((s) => [s.subject, s]));
    return lines.map((line, i) => {
      const s = bySubject.get(line.subject);
      const values = s?.values[line.field] ?? [];
      const scale = line.scale ?? 1;
      return {
        label: line.label ?? s?.name ?? line.subject,
        values: scale === 1 ? values : values.map((v) => (v === null ? null : v * scale)),
        color: line.color ?? PALETTE[i % PALETTE.length],
      };
    });
  }, [history, lines]);
  const t = history?.t ?? NO_TIMES;
  // Points are bucket starts; the axis spans the whole range up to the end of the last bucket.
  const windowSeconds = history ? history.end - history.start : 3600;
  return (
    <div data-testid={testId ? `${testId}-box` : undefined} data-resolution={history?.resolution_s} data-range={history?.range}>
      <TimeChart
        title={title}
        unit={unit}
        format={format}
        range={range}
        t={t}
        series={series}
        windowSeconds={windowSeconds}
        height={height}
        testId={testId}
        end={history?.end}
      />
    </div>
  );
}

const GIB = 1024 ** 3;
export const GIB_SCALE = 1 / GIB;
export const fmt = {
  percent: (v: number) => `${Number(v.toFixed(1))}%`,
  gib: (v: number) => `${Number(v.toFixed(v >= 10 ? 0 : 1))} GiB`,
  celsius: (v: number) => `${Number(v.toFixed(0))} °C`,
  watts: (v: number) => `${Number(v.toFixed(0))} W`,
  tokensPerS: (v: number) => `${Number(v.toFixed(v >= 10 ? 0 : 1))} tok/s`,
  requestsPerS: (v: number) => `${Number(v.toFixed(v >= 10 ? 0 : 2))} req/s`,
  count: (v: number) => `${Number(v.toFixed(1))}`,
  ms: (v: number) => `${Number(v.toFixed(v >= 10 ? 0 : 1))} ms`,
};
