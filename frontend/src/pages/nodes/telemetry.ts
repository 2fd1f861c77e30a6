// The charts' data: the last hour of GPU and engine samples from /api/telemetry/history/, kept current by
// the live feed's `host.telemetry` events. Series are columns (the generated GpuHistory / EngineHistory
// shapes), so a chart takes them as they are.
import { useCallback, useEffect, useState } from "react";
import { api } from "../../api/client";
import type { EngineHistory, EngineLive, GpuHistory, GpuSample, HostTelemetry, TelemetryHistory } from "../../api/types";

export const HISTORY_SECONDS = 3600;

export interface TelemetrySeries {
  gpus: Record<string, GpuHistory>;
  engines: Record<number, EngineHistory>;
}

export const NO_SERIES: TelemetrySeries = { gpus: {}, engines: {} };

export function gpuKey(host: string, gpu: { index: number }): string {
  return `${host}:${gpu.index}`;
}

type Columns<T> = { [K in keyof T]: T[K] extends (number | null)[] ? K : never }[keyof T];
const GPU_COLUMNS = ["utilization_pct", "memory_used_bytes", "temperature_c", "power_watts"] as const satisfies readonly Columns<GpuHistory>[];
const ENGINE_COLUMNS = [
  "tokens_per_s",
  "kv_cache_usage_perc",
  "num_requests_running",
  "num_requests_waiting",
  "ttft_p50_s",
  "itl_p50_s",
] as const satisfies readonly Columns<EngineHistory>[];

/** `series` with one more point (at `ts`), dropping points older than the window. */
function appendPoint<S extends { t: number[] }, C extends keyof S>(
  series: S,
  columns: readonly C[],
  ts: number,
  values: { [K in C]?: number | null },
): S {
  if (series.t.length && ts <= (series.t[series.t.length - 1] ?? 0)) return series; // already have it
  const start = series.t.findIndex((t) => t >= ts - HISTORY_SECONDS);
  const from = start < 0 ? series.t.length : start;
  const next = { ...series, t: [...series.t.slice(from), ts] };
  for (const column of columns) {
    const old = series[column] as unknown as (number | null)[];
    (next[column] as unknown as (number | null)[]) = [...old.slice(from), values[column] ?? null];
  }
  return next;
}

/** Joins columns: `head` (e.g. the history) then the points of `tail` (e.g. live ones) that come after it. */
function join<S extends { t: number[] }>(head: S, tail: S | undefined, columns: readonly (keyof S)[]): S {
  if (!tail) return head;
  const last = head.t[head.t.length - 1] ?? -Infinity;
  const from = tail.t.findIndex((t) => t > last);
  if (from < 0) return head;
  const out = { ...head, t: [...head.t, ...tail.t.slice(from)] };
  for (const column of columns) {
    (out[column] as unknown as (number | null)[]) = [
      ...(head[column] as unknown as (number | null)[]),
      ...(tail[column] as unknown as (number | null)[]).slice(from),
    ];
  }
  return out;
}

function emptyGpu(host: string, sample: GpuSample): GpuHistory {
  return {
    host,
    index: sample.index,
    memory_total_bytes: sample.memory_total_bytes,
    simulated: sample.simulated,
    t: [],
    utilization_pct: [],
    memory_used_bytes: [],
    temperature_c: [],
    power_watts: [],
  };
}

function emptyEngine(engine: EngineLive): EngineHistory {
  return {
    deployment_id: engine.deployment_id,
    name: engine.name,
    host: engine.host,
    t: [],
    tokens_per_s: [],
    kv_cache_usage_perc: [],
    num_requests_running: [],
    num_requests_waiting: [],
    ttft_p50_s: [],
    itl_p50_s: [],
  };
}

/** The series with one `host.telemetry` event's samples added. */
export function addTelemetry(prev: TelemetrySeries, event: HostTelemetry): TelemetrySeries {
  const gpus = { ...prev.gpus };
  for (const sample of event.gpus) {
    const key = gpuKey(event.host, sample);
    const series = gpus[key] ?? emptyGpu(event.host, sample);
    gpus[key] = appendPoint(series, GPU_COLUMNS, sample.ts, sample);
  }
  const engines = { ...prev.engines };
  for (const engine of event.engines) {
    const series = engines[engine.deployment_id] ?? emptyEngine(engine);
    engines[engine.deployment_id] = appendPoint(series, ENGINE_COLUMNS, engine.ts, engine);
  }
  return { gpus, engines };
}

/** The stored history, followed by whatever live samples arrived while it loaded. */
export function withHistory(prev: TelemetrySeries, history: TelemetryHistory): TelemetrySeries {
  const gpus = { ...prev.gpus };
  for (const series of history.gpus) {
    const key = gpuKey(series.host, series);
    gpus[key] = join(series, prev.gpus[key], GPU_COLUMNS);
  }
  const engines = { ...prev.engines };
  for (const series of history.engines) {
    engines[series.deployment_id] = join(series, prev.engines[series.deployment_id], ENGINE_COLUMNS);
  }
  return { gpus, engines };
}

/** Series for the charts: loads the last hour once, then takes each `host.telemetry` event given to `add`. */
export function useTelemetrySeries(query: { deployment?: number | string } = {}) {
  const [series, setSeries] = useState<TelemetrySeries>(NO_SERIES);
  const [error, setError] = useState<unknown>(null);
  const deployment = query.deployment;
  useEffect(() => {
    let cancelled = false;
    const params = deployment === undefined ? { minutes: 60 } : { minutes: 60, deployment };
    api
      .get<TelemetryHistory>("/api/telemetry/history/", params)
      .then((history) => !cancelled && setSeries((prev) => withHistory(prev, history)))
      .catch((err: unknown) => !cancelled && setError(err));
    return () => {
      cancelled = true;
    };
  }, [deployment]);
  const add = useCallback((event: HostTelemetry) => setSeries((prev) => addTelemetry(prev, event)), []);
  return { series, add, error };
}
