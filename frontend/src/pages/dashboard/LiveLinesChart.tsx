// One live chart for several GPUs or engines, instead of a chart each past a handful: one line each while
// the palette has a colour for each (eight), their max, mean and min past that. Each GPU keeps its own
// sample times, so the lines are put on one grid of whole seconds first.
import { useMemo } from "react";
import { MAX_LINES } from "../../components/HistoryChart";
import { acrossLines, movingAverage, onOneGrid } from "../../components/seriesMath";
import { PALETTE, TimeChart, type ChartSeries } from "../../components/TimeChart";

export interface LiveLine {
  label: string;
  t: number[] | undefined;
  values: (number | null)[] | undefined;
}

export function LiveLinesChart({
  lines,
  title,
  unit,
  format,
  range,
  scale = 1,
  smoothSeconds,
  what,
  testId,
}: {
  lines: LiveLine[];
  title: string;
  unit: string;
  format: (value: number) => string;
  range?: [number, number];
  scale?: number;
  smoothSeconds?: number;
  what: string;
  testId: string;
}) {
  const { t, series } = useMemo(() => {
    const grid = onOneGrid(lines.map((l) => ({ t: l.t ?? [], values: (l.values ?? []).map((v) => (v === null ? null : v * scale)) })));
    const drawn = grid.lines.map((values) => (smoothSeconds ? movingAverage(grid.t, values, smoothSeconds) : values));
    if (drawn.length <= MAX_LINES) {
      return { t: grid.t, series: drawn.map((values, i) => ({ label: lines[i]?.label ?? "", values })) as ChartSeries[] };
    }
    const summary = acrossLines(drawn, grid.t.length);
    return {
      t: grid.t,
      series: [
        { label: `max of ${drawn.length} ${what}`, values: summary.max, color: PALETTE[3] },
        { label: `mean of ${drawn.length} ${what}`, values: summary.mean, color: PALETTE[0] },
        { label: `min of ${drawn.length} ${what}`, values: summary.min, color: PALETTE[2] },
      ] as ChartSeries[],
    };
  }, [lines, scale, smoothSeconds, what]);
  return (
    <TimeChart
      title={title}
      unit={unit}
      format={format}
      range={range}
      t={t}
      series={series}
      height={160}
      testId={testId}
      note={smoothSeconds ? `${smoothSeconds} s moving average` : undefined}
    />
  );
}
