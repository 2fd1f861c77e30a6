// A small SVG line chart for live series: no chart library, redraws on every new point.

export interface SeriesPoint {
  t: number;
  v: number;
}

interface SparklineProps {
  points: SeriesPoint[];
  /** Fixed upper bound (e.g. 100 for percent); otherwise the series maximum. */
  max?: number;
  width?: number;
  height?: number;
  label: string;
  testId?: string;
}

export function Sparkline({ points, max, width = 220, height = 48, label, testId }: SparklineProps) {
  const top = Math.max(max ?? 0, ...points.map((p) => p.v), 1e-9);
  const first = points[0]?.t ?? 0;
  const last = points[points.length - 1]?.t ?? 1;
  const span = Math.max(last - first, 1e-9);
  const path = points
    .map((p, i) => {
      const x = ((p.t - first) / span) * (width - 2) + 1;
      const y = height - 1 - (p.v / top) * (height - 2);
      return `${i === 0 ? "M" : "L"}${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(" ");
  return (
    <svg
      className="sparkline"
      width={width}
      height={height}
      viewBox={`0 0 ${width} ${height}`}
      role="img"
      aria-label={label}
      data-testid={testId}
      data-points={points.length}
    >
      <rect x="0" y="0" width={width} height={height} fill="none" stroke="currentColor" strokeOpacity="0.15" />
      {points.length > 1 && <path d={path} fill="none" stroke="currentColor" strokeWidth="1.5" />}
    </svg>
  );
}

/** Append a point, keeping the last `keep` points. */
export function pushPoint(series: SeriesPoint[] | undefined, point: SeriesPoint, keep = 120): SeriesPoint[] {
  const next = [...(series ?? []), point];
  return next.length > keep ? next.slice(next.length - keep) : next;
}
