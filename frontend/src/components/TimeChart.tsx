// A time-series chart drawn by uPlot: a time axis over a fixed window ending now, a value axis with units,
// a legend with each line's last, mean and max over the range shown, and a tooltip with every series'
// value at the pointer. Colours are Okabe and Ito's colour-blind-safe set, never repeated (past eight
// lines they come back dashed, then dotted); a point with no neighbour is drawn as a dot, not lost. Inside a
// ChartSync (components/chartSync.tsx) charts share one zoomable time range and the crosshair.
import { useEffect, useMemo, useRef } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { useChartSync } from "./chartSync";

export interface ChartSeries {
  label: string;
  /** One value per time in `t`; null is a gap (no sample, or no value in it). */
  values: (number | null)[];
  color?: string;
  /** Canvas dash pattern, e.g. [6, 3]; default: seriesStyle's for the line's position. */
  dash?: number[];
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
  /** A note after the window in the caption, e.g. "15 s moving average". */
  note?: string;
}

/** Okabe & Ito's palette ("Color Universal Design"), told apart with every common colour-vision deficiency;
 * yellow last, the hardest to read on white. */
export const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442"];
const DASHES: number[][] = [[], [6, 3], [1.5, 3]];

/** Line `i`'s colour and dash: each of the palette's colours solid, then dashed, then dotted. */
export function seriesStyle(i: number): { color: string; dash: number[] } {
  return { color: PALETTE[i % PALETTE.length] ?? "#000000", dash: DASHES[Math.floor(i / PALETTE.length) % DASHES.length] ?? [] };
}

/** The indices of values with no value beside them: a line cannot draw them, so they get a dot. */
function isolatedPoints(u: uPlot, seriesIdx: number, show: boolean): number[] | null {
  if (show) return null; // uPlot draws every point already (few of them)
  const ys = u.data[seriesIdx] as (number | null | undefined)[];
  const out: number[] = [];
  for (let i = 0; i < ys.length; i++) {
    if (ys[i] == null) continue;
    if ((i === 0 || ys[i - 1] == null) && (i === ys.length - 1 || ys[i + 1] == null)) out.push(i);
  }
  return out.length ? out : null;
}

export interface LegendStats {
  last: number | null;
  mean: number | null;
  max: number | null;
}

/** Last, mean and max of a line's values at times within [from, to]. */
export function legendStats(t: number[], values: (number | null)[], from: number, to: number): LegendStats {
  let last: number | null = null;
  let sum = 0;
  let n = 0;
  let max: number | null = null;
  for (let i = 0; i < t.length; i++) {
    const v = values[i];
    const at = t[i];
    if (v === null || v === undefined || at === undefined || at < from || at > to) continue;
    last = v;
    sum += v;
    n += 1;
    max = max === null ? v : Math.max(max, v);
  }
  return { last, mean: n ? sum / n : null, max };
}

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
          const stroke = typeof s.stroke === "function" ? s.stroke(u, i + 1) : s.stroke;
          swatch.style.background = String(stroke ?? "");
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

export function TimeChart({ t, series, format, unit, title, windowSeconds = 3600, range, height = 160, testId, end, note }: TimeChartProps) {
  const container = useRef<HTMLDivElement>(null);
  const chart = useRef<uPlot | null>(null);
  const window_ = useRef<[number, number]>([0, 1]);
  const latest = useRef({ t, series });
  latest.current = { t, series };
  const sync = useChartSync();
  const zoom = sync?.zoom ?? null;
  const zoomRef = useRef(zoom);
  zoomRef.current = zoom;
  const setZoomRef = useRef(sync?.setZoom);
  setZoomRef.current = sync?.setZoom;
  const syncKey = sync?.key ?? "";
  // The chart is rebuilt when its shape changes (series, units), and only fed new data otherwise.
  const shape = `${series.map((s) => `${s.label}:${s.color ?? ""}`).join("|")}|${unit}|${range?.join(",") ?? ""}|${height}|${windowSeconds}|${syncKey}`;

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
        x: { time: true, range: () => zoomRef.current ?? window_.current },
        y: { range: yRange },
      },
      series: [
        { value: (_u, v) => (v === null ? "—" : timeOf(v)) },
        ...latest.current.series.map((s, i) => ({
          label: s.label,
          stroke: s.color ?? seriesStyle(i).color,
          dash: s.dash ?? seriesStyle(i).dash,
          width: 1.5,
          spanGaps: false,
          points: { size: 5, filter: isolatedPoints },
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
      // The legend is ours (below): last, mean and max of each line, not uPlot's value under the pointer.
      legend: { show: false },
      cursor: syncKey ? { drag: { x: true, y: false, setScale: false }, sync: { key: syncKey } } : { drag: { x: false, y: false } },
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
        // A drag across the chart zooms every chart of its ChartSync to that time.
        setSelect: [
          (u) => {
            if (u.select.width > 3) {
              const from = u.posToVal(u.select.left, "x");
              const to = u.posToVal(u.select.left + u.select.width, "x");
              setZoomRef.current?.([from, to]);
            }
            if (u.select.width > 0) u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          },
        ],
      },
    };
    const u = new uPlot(opts, toData(latest.current.t, latest.current.series, window_, windowSeconds, end), el);
    chart.current = u;
    const unzoom = () => setZoomRef.current?.(null);
    if (syncKey) u.over.addEventListener("dblclick", unzoom);
    const resize = new ResizeObserver(() => u.setSize({ width: Math.max(200, el.clientWidth), height }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      u.over.removeEventListener("dblclick", unzoom);
      u.destroy();
      chart.current = null;
    };
    // `format` is read at build time: a chart's unit does not change without its shape changing.
  }, [shape]);

  useEffect(() => {
    chart.current?.setData(toData(t, series, window_, windowSeconds, end));
  }, [t, series, windowSeconds, end]);

  useEffect(() => {
    const [min, max] = zoom ?? window_.current;
    // The charts that only followed a drag (through the synced cursor) keep its box: clear it here.
    chart.current?.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    chart.current?.setScale("x", { min, max });
  }, [zoom]);

  const points = t.length;
  const endAt = end ?? Math.max(Date.now() / 1000, t[t.length - 1] ?? 0);
  const [from, to] = zoom ?? [endAt - windowSeconds, endAt];
  const legend = useMemo(
    () => series.map((s, i) => ({ label: s.label, style: { color: s.color ?? seriesStyle(i).color, dash: s.dash ?? seriesStyle(i).dash }, ...legendStats(t, s.values, from, to) })),
    [series, t, from, to],
  );
  const show = (v: number | null) => (v === null ? "no data" : format(v));
  return (
    <figure className="time-chart" data-testid={testId} data-points={points} aria-label={`${title} (${unit}), ${windowLabel(windowSeconds)}`}>
      <figcaption>
        <span>{title}</span> <span className="muted">{zoom ? "zoomed" : windowLabel(windowSeconds)}</span>
        {note && <span className="muted" data-testid={testId ? `${testId}-note` : undefined}> · {note}</span>}
        {points === 0 && <span className="muted"> · no samples yet</span>}
      </figcaption>
      <div ref={container} className="time-chart-plot" />
      {legend.length > 0 && (
      <table className="chart-legend" data-testid={testId ? `${testId}-legend` : undefined}>
        <thead>
          <tr>
            <th />
            <th>last</th>
            <th>mean</th>
            <th>max</th>
          </tr>
        </thead>
        <tbody>
          {legend.map((row, i) => (
            <tr key={i} data-series={row.label}>
              <td className="chart-legend-label">
                <span className={row.style.dash.length ? "chart-swatch chart-swatch-dashed" : "chart-swatch"} style={{ background: row.style.color, color: row.style.color }} />
                {row.label}
              </td>
              <td className="num" data-stat="last">{show(row.last)}</td>
              <td className="num" data-stat="mean">{show(row.mean)}</td>
              <td className="num" data-stat="max">{show(row.max)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      )}
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
