// The fleet's charts: each one hour of a GPU's or an engine's samples, with units on the value axis.
import { useMemo } from "react";
import type { EngineHistory, GpuHistory } from "../../api/types";
import { movingAverage } from "../../components/seriesMath";
import { PALETTE, TimeChart } from "../../components/TimeChart";

const GIB = 1024 ** 3;
const NO_TIMES: number[] = [];

function scaled(values: (number | null)[] | undefined, factor: number): (number | null)[] {
  return (values ?? []).map((v) => (v === null ? null : v * factor));
}

const percent = (v: number) => `${Number(v.toFixed(1))}%`;
const gib = (v: number) => `${Number(v.toFixed(v >= 10 ? 0 : 1))} GiB`;
const perSecond = (v: number) => `${Number(v.toFixed(v >= 10 ? 0 : 1))} tok/s`;
const count = (v: number) => `${Number(v.toFixed(1))}`;
const millis = (v: number) => `${Number(v.toFixed(v >= 10 ? 0 : 1))} ms`;

// Utilization sampled at 1 Hz swings between 0 and 100% from one kernel to the next: drawn raw it is a solid
// block. A trailing mean over this long keeps the trend and still shows a stall within a minute.
export const UTILIZATION_SMOOTH_SECONDS = 15;

export function GpuUtilizationChart({ series, testId }: { series: GpuHistory | undefined; testId?: string }) {
  const lines = useMemo(
    () => [{ label: "utilization", values: movingAverage(series?.t ?? NO_TIMES, series?.utilization_pct ?? [], UTILIZATION_SMOOTH_SECONDS) }],
    [series],
  );
  return (
    <TimeChart
      title="GPU utilization"
      unit="%"
      format={percent}
      range={[0, 100]}
      t={series?.t ?? NO_TIMES}
      series={lines}
      height={140}
      testId={testId}
      note={`${UTILIZATION_SMOOTH_SECONDS} s moving average`}
    />
  );
}

export function GpuMemoryChart({ series, totalBytes, testId }: { series: GpuHistory | undefined; totalBytes: number; testId?: string }) {
  const lines = useMemo(() => [{ label: "used", values: scaled(series?.memory_used_bytes, 1 / GIB), color: PALETTE[4] }], [series]);
  return (
    <TimeChart
      title="GPU memory used"
      unit="GiB"
      format={gib}
      range={[0, totalBytes / GIB]}
      t={series?.t ?? NO_TIMES}
      series={lines}
      height={120}
      testId={testId}
    />
  );
}

export function EngineThroughputChart({ series, title = "Throughput", testId }: { series: EngineHistory | undefined; title?: string; testId?: string }) {
  const lines = useMemo(() => [{ label: "generated", values: series?.tokens_per_s ?? [] }], [series]);
  return <TimeChart title={title} unit="tokens/s" format={perSecond} t={series?.t ?? NO_TIMES} series={lines} height={140} testId={testId} />;
}

export function EngineRequestsChart({ series, testId }: { series: EngineHistory | undefined; testId?: string }) {
  const lines = useMemo(
    () => [
      { label: "running", values: series?.num_requests_running ?? [] },
      { label: "waiting", values: series?.num_requests_waiting ?? [], color: PALETTE[1] },
    ],
    [series],
  );
  return <TimeChart title="Requests" unit="requests" format={count} t={series?.t ?? NO_TIMES} series={lines} height={140} testId={testId} />;
}

export function EngineKvCacheChart({ series, testId }: { series: EngineHistory | undefined; testId?: string }) {
  const lines = useMemo(() => [{ label: "KV cache used", values: scaled(series?.kv_cache_usage_perc, 100), color: PALETTE[2] }], [series]);
  return <TimeChart title="KV cache usage" unit="%" format={percent} range={[0, 100]} t={series?.t ?? NO_TIMES} series={lines} height={140} testId={testId} />;
}

export function EngineLatencyChart({ series, testId }: { series: EngineHistory | undefined; testId?: string }) {
  const lines = useMemo(
    () => [
      { label: "TTFT p50", values: scaled(series?.ttft_p50_s, 1000) },
      { label: "ITL p50", values: scaled(series?.itl_p50_s, 1000), color: PALETTE[3] },
    ],
    [series],
  );
  return <TimeChart title="Latency (medians over 10 s)" unit="ms" format={millis} t={series?.t ?? NO_TIMES} series={lines} height={140} testId={testId} />;
}
