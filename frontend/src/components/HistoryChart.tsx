// One chart of GET /api/history/'s answer: chosen fields of chosen subjects as lines on the range's time axis.
import { useMemo } from "react";
import type { History } from "../api/types";
import { acrossLines, movingAverage } from "./seriesMath";
import { PALETTE, TimeChart, type ChartSeries } from "./TimeChart";

export interface HistoryLine {
  /** The subject's name in the answer, e.g. "gpu:demo-a:0", "pool:fast". */
  subject: string;
  field: string;
  /** Legend label; default: the subject's name. */
  label?: string;
  /** Multiplies each value, e.g. 100 for a ratio drawn in %, 1e3 for seconds drawn in ms. */
  scale?: number;
  color?: string;
  dash?: number[];
}

/** Past this many lines a chart draws their min, mean and max instead: the palette has this many colours. */
export const MAX_LINES = PALETTE.length;

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
  smoothSeconds,
  what = "lines",
}: {
  history: History | undefined;
  lines: HistoryLine[];
  title: string;
  unit: string;
  format: (value: number) => string;
  range?: [number, number];
  height?: number;
  testId?: string;
  /** Draw a trailing moving average over this many seconds (at least one point), and say so. */
  smoothSeconds?: number;
  /** What the lines are, for the summary's labels past MAX_LINES: "GPUs", "engines". */
  what?: string;
}) {
  const resolution = history?.resolution_s ?? 10;
  const window = smoothSeconds ? Math.max(smoothSeconds, resolution) : 0;
  const t = history?.t ?? NO_TIMES;
  const series = useMemo((): ChartSeries[] => {
    const bySubject = new Map((history?.series ?? []).map((s) => [s.subject, s]));
    const drawn = lines.map((line) => {
      const s = bySubject.get(line.subject);
      const raw = s?.values[line.field] ?? [];
      const scale = line.scale ?? 1;
      const values = scale === 1 ? raw : raw.map((v) => (v === null ? null : v * scale));
      return {
        label: line.label ?? s?.name ?? line.subject,
        values: window > resolution ? movingAverage(t, values, window) : values,
        color: line.color,
        dash: line.dash,
      };
    });
    if (drawn.length <= MAX_LINES) return drawn;
    // One line per GPU past a handful is a tangle nobody reads: the spread across them instead.
    const summary = acrossLines(
      drawn.map((d) => d.values),
      t.length,
    );
    return [
      { label: `max of ${drawn.length} ${what}`, values: summary.max, color: PALETTE[3] },
      { label: `mean of ${drawn.length} ${what}`, values: summary.mean, color: PALETTE[0] },
      { label: `min of ${drawn.length} ${what}`, values: summary.min, color: PALETTE[2] },
    ];
  }, [history, lines, t, window, resolution, what]);
  // Points are bucket starts; the axis spans the whole range up to the end of the last bucket.
  const windowSeconds = history ? history.end - history.start : 3600;
  const note = window > resolution ? `${formatSpan(window)} moving average` : undefined;
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
        note={note}
      />
    </div>
  );
}

/** 60 -> "1 min", 30 -> "30 s", 3600 -> "1 h". */
export function formatSpan(seconds: number): string {
  if (seconds >= 3600 && seconds % 3600 === 0) return `${seconds / 3600} h`;
  if (seconds >= 60 && seconds % 60 === 0) return `${seconds / 60} min`;
  return `${seconds} s`;
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
