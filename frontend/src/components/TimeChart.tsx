// A time-series chart drawn by uPlot: a time axis over a fixed window ending now, a value axis with units,
// a legend, and a tooltip with every series' value at the pointer.
import { useEffect, useRef } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

export interface ChartSeries {
  label: string;
  /** One value per time in `t`; null is a gap (no sample, or no value in it). */
  values: (number | null)[];
  color?: string;
}

interface TimeChartProps {
  /** Sample times, unix seconds, ascending. */
  t: number[];
  series: ChartSeries[];
  /** Formats a value with its unit, for the tooltip and legend, e.g. (v) => `${v}%`. */
  format: (value: number) => string;
  /** The unit as the axis names it, e.g. "%", "GiB", "tokens/s". */
  unit: string;
  title: string;
  /** The time window shown, ending now (default one hour). */
  windowSeconds?: number;
  /** Fixed value range, e.g. [0, 100] for percentages; otherwise from 0 to the data's maximum. */
  range?: [number, number];
  height?: number;
  testId?: string;
  /** End of the time window, unix seconds (default: now, or the last sample if later). */
  end?: number;
}

export const PALETTE = ["#2f5bd3", "#1e8a4c", "#c2372f", "#a86a00", "#7a3fc2", "#138a8a"];

/** "last hour", "last 10 min": the window as a chart subtitle. */
export function windowLabel(seconds: number): string {
  return seconds >= 3600 && seconds % 3600 === 0
    ? seconds === 3600
      ? "last hour"
      : `last ${seconds / 3600} h`
    : `last ${Math.round(seconds / 60)} min`;
}

/** 0.5, 12, 950, 1.2k, 3.4M: short enough for an axis. */
export function compactNumber(value: number): string {
  const abs = Math.abs(value);
  if (abs >= 1e6) return `${Number((value / 1e6).toFixed(1))}M`;
  if (abs >= 1e4) return `${Number((value / 1e3).toFixed(0))}k`;
  if (abs >= 1e3) return `${Number((value / 1e3).toFixed(1))}k`;
  return `${Number(value.toFixed(abs > 0 && abs < 10 ? 2 : 0))}`;
}

function timeOf(seconds: number): string {
  return new Date(seconds * 1000).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

/** The tooltip: the time and each series' value at the cursor, in a box that follows it. */
function tooltipPlugin(format: (value: number) => string, testId: string | undefined): uPlot.Plugin {
  let box: HTMLDivElement | null = null;
  return {
    hooks: {
      init: (u) => {
        box = document.createElement("div");
        box.className = "chart-tooltip";
        if (testId) box.dataset.testid = `${testId}-tooltip`;
        box.style.display = "none";
        u.over.appendChild(box);
      },
      setCursor: (u) => {
        if (!box) return;
        const idx = u.cursor.idx;
        const left = u.cursor.left ?? -1;
        if (idx === null || idx === undefined || left < 0) {
          box.style.display = "none";
          return;
        }
        const time = u.data[0][idx];
        // Built with text nodes: series labels are deployment names, never HTML.
        const rows = u.series.slice(1).map((s, i) => {
          const value = u.data[i + 1]?.[idx];
          const row = document.createElement("div");
          const swatch = document.createElement("span");
          swatch.className = "chart-swatch";
          swatch.style.background = String(s.stroke ?? "");
          const strong = document.createElement("strong");
          strong.textContent = value === null || value === undefined ? "—" : format(value);
          row.append(swatch, `${String(s.label ?? "")}: `, strong);
          return row;
        });
        const head = document.createElement("div");
        head.className = "muted";
        head.textContent = time === undefined ? "" : timeOf(time);
        box.replaceChildren(head, ...rows);
        box.style.display = "block";
        const overWidth = u.over.clientWidth;
        const boxWidth = box.offsetWidth;
        box.style.left = `${Math.min(Math.max(0, left + 12), Math.max(0, overWidth - boxWidth))}px`;
        box.style.top = `${Math.max(0, (u.cursor.top ?? 0) - 10)}px`;
      },
    },
  };
}

export function TimeChart({ t, series, format, unit, title, windowSeconds = 3600, range, height = 160, testId, end }: TimeChartProps) {
  const container = useRef<HTMLDivElement>(null);
  const chart = useRef<uPlot | null>(null);
  const window_ = useRef<[number, number]>([0, 1]);
  const latest = useRef({ t, series });
  latest.current = { t, series };
  // The chart is rebuilt when its shape changes (series, units), and only fed new data otherwise.
  const shape = `${series.map((s) => s.label).join("|")}|${unit}|${range?.join(",") ?? ""}|${height}|${windowSeconds}`;

  useEffect(() => {
    const el = container.current;
    if (!el) return;
    const yRange: uPlot.Scale.Range = range
      ? () => [range[0], range[1]]
      : (_u, _min, max) => [0, max === null || max <= 0 ? 1 : max * 1.1];
    const opts: uPlot.Options = {
      width: Math.max(200, el.clientWidth),
      height,
      scales: {
        x: { time: true, range: () => window_.current },
        y: { range: yRange },
      },
      series: [
        { value: (_u, v) => (v === null ? "—" : timeOf(v)) },
        ...latest.current.series.map((s, i) => ({
          label: s.label,
          stroke: s.color ?? PALETTE[i % PALETTE.length],
          width: 1.5,
          spanGaps: false,
          points: { show: false },
          value: (_u: uPlot, v: number | null) => (v === null ? "—" : format(v)),
        })),
      ],
      axes: [
        { stroke: "#5f6b7a", grid: { stroke: "#edf0f3" }, ticks: { stroke: "#dfe3e8" } },
        {
          stroke: "#5f6b7a",
          grid: { stroke: "#edf0f3" },
          ticks: { stroke: "#dfe3e8" },
          size: 56,
          label: unit,
          labelSize: 18,
          // Ticks are bare numbers; the axis label carries the unit.
          values: (_u, splits) => splits.map(compactNumber),
        },
      ],
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false } },
      plugins: [tooltipPlugin(format, testId)],
      hooks: {
        // The time range drawn, on the figure: tests (and curious users) can read what the axis spans.
        setScale: [
          (u, key) => {
            const figure = el.parentElement;
            if (key !== "x" || !figure) return;
            figure.dataset.xMin = String(u.scales.x?.min ?? "");
            figure.dataset.xMax = String(u.scales.x?.max ?? "");
          },
        ],
      },
    };
    const u = new uPlot(opts, toData(latest.current.t, latest.current.series, window_, windowSeconds, end), el);
    chart.current = u;
    const resize = new ResizeObserver(() => u.setSize({ width: Math.max(200, el.clientWidth), height }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      u.destroy();
      chart.current = null;
    };
    // `format` is read at build time: a chart's unit does not change without its shape changing.
  }, [shape]);

  useEffect(() => {
    chart.current?.setData(toData(t, series, window_, windowSeconds, end));
  }, [t, series, windowSeconds, end]);

  const points = t.length;
  return (
    <figure className="time-chart" data-testid={testId} data-points={points} aria-label={`${title} (${unit}), ${windowLabel(windowSeconds)}`}>
      <figcaption>
        <span>{title}</span> <span className="muted">{windowLabel(windowSeconds)}</span>
        {points === 0 && <span className="muted"> · no samples yet</span>}
      </figcaption>
      <div ref={container} className="time-chart-plot" />
    </figure>
  );
}

function toData(
  t: number[],
  series: ChartSeries[],
  window_: { current: [number, number] },
  windowSeconds: number,
  endAt?: number,
): uPlot.AlignedData {
  const end = endAt ?? Math.max(Date.now() / 1000, t[t.length - 1] ?? 0);
  window_.current = [end - windowSeconds, end];
  return [t, ...series.map((s) => s.values)];
}
