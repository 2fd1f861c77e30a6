// A deployment's performance baselines: saved `inferchain bench` runs (docs/bench.md), the newest drawn as
// latency and throughput against load, and the live engine checked against it at the load it carries now.
import { useEffect, useMemo, useRef, useState } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { ApiError, api, errorMessage } from "../../api/client";
import type { BaselineCheck, PerformanceBaseline, PerformanceBaselinePage } from "../../api/types";
import { Card } from "../../components/Page";
import { PALETTE } from "../../components/TimeChart";
import { formatDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";

const CHECK_EVERY_MS = 5000;

function ms(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : `${(value * 1000).toFixed(0)} ms`;
}

/** TTFT p50/p95 (ms, left axis) and output tokens/s (right axis) against clients or requests/s. */
function LoadCurve({ baseline, liveLoad, liveTtft }: { baseline: PerformanceBaseline; liveLoad: number | null; liveTtft: number | null }) {
  const el = useRef<HTMLDivElement>(null);
  const closed = baseline.mode === "closed";
  const data = useMemo(() => {
    const x = baseline.levels.map((lv) => (closed ? (lv.clients ?? 0) : (lv.rate ?? 0)));
    const toMs = (v: number | null | undefined) => (v === null || v === undefined ? null : v * 1000);
    const live = x.map(() => null as number | null);
    const xs = [...x];
    // The live point is drawn on its own series at its own x (inserted in order).
    if (closed && liveLoad !== null && liveTtft !== null && xs.includes(liveLoad)) {
      live[xs.indexOf(liveLoad)] = liveTtft * 1000;
    } else if (closed && liveLoad !== null && liveTtft !== null) {
      const at = xs.findIndex((v) => v > liveLoad);
      const i = at === -1 ? xs.length : at;
      xs.splice(i, 0, liveLoad);
      live.splice(i, 0, liveTtft * 1000);
      const pad = <T,>(arr: T[]) => {
        const copy = [...arr];
        copy.splice(i, 0, null as T);
        return copy;
      };
      return [
        xs,
        pad(baseline.levels.map((lv) => toMs(lv.ttft_p50_s))),
        pad(baseline.levels.map((lv) => toMs(lv.ttft_p95_s))),
        pad(baseline.levels.map((lv) => lv.output_tokens_per_s)),
        live,
      ] as uPlot.AlignedData;
    }
    return [
      x,
      baseline.levels.map((lv) => toMs(lv.ttft_p50_s)),
      baseline.levels.map((lv) => toMs(lv.ttft_p95_s)),
      baseline.levels.map((lv) => lv.output_tokens_per_s),
      live,
    ] as uPlot.AlignedData;
  }, [baseline, closed, liveLoad, liveTtft]);

  useEffect(() => {
    if (!el.current) return;
    const opts: uPlot.Options = {
      width: Math.max(320, el.current.clientWidth || 640),
      height: 240,
      scales: { x: { time: false }, ms: { range: (_u, _min, max) => [0, Math.max(1, max * 1.1)] }, tps: {} },
      axes: [
        { label: closed ? "concurrent clients" : "requests/s offered" },
        { scale: "ms", label: "TTFT (ms)", values: (_u, vals) => vals.map((v) => `${v}`) },
        { scale: "tps", side: 1, label: "output tokens/s", grid: { show: false } },
      ],
      series: [
        { label: closed ? "clients" : "req/s" },
        { label: "TTFT p50", scale: "ms", stroke: PALETTE[0], spanGaps: true, points: { show: true } },
        { label: "TTFT p95", scale: "ms", stroke: PALETTE[2], spanGaps: true, points: { show: true } },
        { label: "tokens/s", scale: "tps", stroke: PALETTE[1], dash: [6, 4], spanGaps: true, points: { show: true } },
        { label: "live TTFT p95", scale: "ms", stroke: "#000", width: 0, points: { show: true, size: 10, fill: "#000" } },
      ],
    };
    const chart = new uPlot(opts, data, el.current);
    return () => chart.destroy();
  }, [data, closed]);

  return <div ref={el} className="baseline-curve" data-testid="baseline-curve" />;
}

/** Baselines of one deployment; admins upload a bench run's JSON as a new one. */
export function BaselinePanel({ deploymentId, isAdmin }: { deploymentId: string; isAdmin: boolean }) {
  const list = useApi<PerformanceBaselinePage>("/api/baselines/", { deployment: deploymentId });
  const [check, setCheck] = useState<BaselineCheck | null>(null);
  const [name, setName] = useState("");
  const [file, setFile] = useState<File | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const newest = list.data?.results[0];

  useEffect(() => {
    let stopped = false;
    const load = () =>
      api
        .get<BaselineCheck>(`/api/deployments/${deploymentId}/baseline-check/`)
        .then((c) => !stopped && setCheck(c))
        .catch(() => undefined);
    load();
    const timer = setInterval(load, CHECK_EVERY_MS);
    return () => {
      stopped = true;
      clearInterval(timer);
    };
  }, [deploymentId, newest?.id]);

  async function save() {
    if (!file) return;
    setBusy(true);
    setError(null);
    try {
      let report: unknown;
      try {
        report = JSON.parse(await file.text());
      } catch {
        throw new Error(`${file.name} is not JSON: upload the file \`inferchain bench --out\` wrote.`);
      }
      await api.post<PerformanceBaseline>("/api/baselines/", { deployment: Number(deploymentId), name: name || file.name, report });
      setFile(null);
      setName("");
      list.reload();
    } catch (err) {
      // The report's problems are field errors ("report", "name"): show them, not the generic line.
      const fields = err instanceof ApiError ? Object.entries(err.fieldErrors).map(([k, v]) => `${k}: ${v.join(" ")}`) : [];
      setError(fields.length ? fields.join(" · ") : errorMessage(err));
    } finally {
      setBusy(false);
    }
  }

  return (
    <Card title="Performance baseline" testId="baseline-panel">
      {newest ? (
        <>
          <div data-testid="baseline-name">
            <strong>{newest.name}</strong>{" "}
            <span className="muted">
              saved {formatDateTime(newest.created_at)} by {newest.created_by ?? "—"} · {newest.model} at {newest.target} · goodput SLO TTFT &lt;{" "}
              {ms(newest.slo_ttft_s)}, TPOT &lt; {ms(newest.slo_itl_s)}
              {newest.knee_index !== null && newest.knee_index !== undefined && (
                <> · knee at {newest.levels[newest.knee_index]?.clients ?? newest.levels[newest.knee_index]?.rate}</>
              )}
            </span>
          </div>
          {check && (
            <div
              className={`notice ${check.status === "outside" ? "notice-bad" : check.status === "within" ? "notice-info" : "notice-warn"}`}
              data-testid="baseline-check"
              data-status={check.status}
            >
              {check.message}
            </div>
          )}
          <LoadCurve baseline={newest} liveLoad={check?.load ?? null} liveTtft={check?.live_ttft_p95_s ?? null} />
          <table className="table" data-testid="baseline-levels">
            <thead>
              <tr>
                <th>{newest.mode === "closed" ? "clients" : "req/s offered"}</th>
                <th>req/s</th>
                <th>tokens/s</th>
                <th>goodput</th>
                <th>TTFT p50 / p95</th>
                <th>ITL p50 / p95</th>
                <th>e2e p50 / p99</th>
                <th>errors</th>
              </tr>
            </thead>
            <tbody>
              {newest.levels.map((lv, i) => (
                <tr key={i}>
                  <td>{lv.clients ?? lv.rate}</td>
                  <td>{lv.requests_per_s.toFixed(2)}</td>
                  <td>{lv.output_tokens_per_s.toFixed(0)}</td>
                  <td>{lv.goodput_requests_per_s.toFixed(2)}</td>
                  <td>
                    {ms(lv.ttft_p50_s)} / {ms(lv.ttft_p95_s)}
                  </td>
                  <td>
                    {ms(lv.itl_p50_s)} / {ms(lv.itl_p95_s)}
                  </td>
                  <td>
                    {ms(lv.latency_p50_s)} / {ms(lv.latency_p99_s)}
                  </td>
                  <td>{lv.error_count}</td>
                </tr>
              ))}
            </tbody>
          </table>
          {(list.data?.count ?? 0) > 1 && <div className="muted">{(list.data?.count ?? 0) - 1} older baseline(s) kept.</div>}
        </>
      ) : (
        <p className="muted" data-testid="baseline-empty">
          No baseline yet. Run <code>inferchain bench --target … --out run.json</code> against this deployment and save the file here.
        </p>
      )}
      {isAdmin && (
        <div className="baseline-upload">
          <input aria-label="Baseline name" placeholder="name, e.g. before the upgrade" value={name} onChange={(e) => setName(e.target.value)} />
          <input aria-label="Bench run JSON" type="file" accept=".json,application/json" data-testid="baseline-file" onChange={(e) => setFile(e.target.files?.[0] ?? null)} />
          <button type="button" className="btn" disabled={!file || busy} onClick={save} data-testid="baseline-save">
            Save as baseline
          </button>
          {error && <div className="notice notice-bad" data-testid="baseline-error">{error}</div>}
        </div>
      )}
    </Card>
  );
}
