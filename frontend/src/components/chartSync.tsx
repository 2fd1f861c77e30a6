// One time range for a page's charts, as a Grafana dashboard has: drag across any chart to zoom them all,
// double-click one (or "Reset zoom") to go back to the picked window; the pointer's crosshair moves on
// every chart at once. Charts outside a ChartSync keep their own range and do not zoom.
import { createContext, useContext, useMemo, useState, type ReactNode } from "react";

export type TimeRange = [number, number];

export interface ChartSyncState {
  /** uPlot's cursor sync key: charts with the same key share the crosshair. */
  key: string;
  /** The zoomed range (unix seconds), or null for each chart's own window. */
  zoom: TimeRange | null;
  setZoom: (range: TimeRange | null) => void;
}

const ChartSyncContext = createContext<ChartSyncState | null>(null);

export function ChartSync({ syncKey, children }: { syncKey: string; children: ReactNode }) {
  const [zoom, setZoom] = useState<TimeRange | null>(null);
  const value = useMemo(() => ({ key: syncKey, zoom, setZoom }), [syncKey, zoom]);
  return <ChartSyncContext.Provider value={value}>{children}</ChartSyncContext.Provider>;
}

export function useChartSync(): ChartSyncState | null {
  return useContext(ChartSyncContext);
}

function clock(seconds: number): string {
  return new Date(seconds * 1000).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

/** "Zoomed to 10:02:10–10:17:40 · Reset zoom" while the charts are zoomed; a hint otherwise. */
export function ZoomBar({ testId = "chart-zoom" }: { testId?: string }) {
  const sync = useChartSync();
  if (!sync) return null;
  return (
    <div className="zoom-bar muted" data-testid={testId} data-zoomed={sync.zoom ? "true" : "false"}>
      {sync.zoom ? (
        <>
          Zoomed to {clock(sync.zoom[0])}–{clock(sync.zoom[1])} on every chart{" "}
          <button type="button" className="btn btn-small" data-testid={`${testId}-reset`} onClick={() => sync.setZoom(null)}>
            Reset zoom
          </button>
        </>
      ) : (
        "Drag across a chart to zoom every chart to that time; double-click to reset."
      )}
    </div>
  );
}
