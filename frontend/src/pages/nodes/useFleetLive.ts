// Live fleet state from the WebSocket: latest GPU samples and engine metrics per host, short histories
// for the charts, and the measured delay from a GPU sample on the agent to its arrival in this browser.
import { useCallback, useState } from "react";
import { useLive, type LiveEvent } from "../../hooks/useLive";
import { pushPoint, type SeriesPoint } from "./Sparkline";
import type { EngineLive, GpuSample, HostTelemetry } from "./types";

export interface FleetLive {
  connected: boolean;
  hosts: Record<string, HostTelemetry>;
  engines: Record<number, EngineLive>;
  gpuUtil: Record<string, SeriesPoint[]>;
  gpuMem: Record<string, SeriesPoint[]>;
  engineTps: Record<number, SeriesPoint[]>;
  engineKv: Record<number, SeriesPoint[]>;
  /** Sample -> browser delays (ms) of the last events, newest last. */
  latenciesMs: number[];
  events: number;
}

const EMPTY: Omit<FleetLive, "connected"> = {
  hosts: {},
  engines: {},
  gpuUtil: {},
  gpuMem: {},
  engineTps: {},
  engineKv: {},
  latenciesMs: [],
  events: 0,
};

export function gpuKey(host: string, gpu: GpuSample): string {
  return `${host}:${gpu.index}`;
}

export function median(values: number[]): number | null {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  const upper = sorted[mid] ?? 0;
  return sorted.length % 2 ? upper : ((sorted[mid - 1] ?? upper) + upper) / 2;
}

/** Subscribes to the fleet group (every socket is in it) plus `extraGroups`. */
export function useFleetLive(extraGroups: string[] = [], onOther?: (event: LiveEvent) => void): FleetLive {
  const [state, setState] = useState(EMPTY);
  const handle = useCallback(
    (event: LiveEvent) => {
      if (event.type !== "host.telemetry") {
        onOther?.(event);
        return;
      }
      const telemetry = event as unknown as HostTelemetry;
      const arrived = Date.now();
      setState((prev) => {
        const next = { ...prev, hosts: { ...prev.hosts, [telemetry.host]: telemetry }, events: prev.events + 1 };
        next.gpuUtil = { ...prev.gpuUtil };
        next.gpuMem = { ...prev.gpuMem };
        for (const gpu of telemetry.gpus) {
          const key = gpuKey(telemetry.host, gpu);
          next.gpuUtil[key] = pushPoint(prev.gpuUtil[key], { t: gpu.ts, v: gpu.utilization_pct });
          next.gpuMem[key] = pushPoint(prev.gpuMem[key], { t: gpu.ts, v: gpu.memory_used_bytes });
        }
        next.engines = { ...prev.engines };
        next.engineTps = { ...prev.engineTps };
        next.engineKv = { ...prev.engineKv };
        for (const engine of telemetry.engines) {
          next.engines[engine.deployment_id] = engine;
          next.engineTps[engine.deployment_id] = pushPoint(prev.engineTps[engine.deployment_id], { t: engine.ts, v: engine.tokens_per_s });
          next.engineKv[engine.deployment_id] = pushPoint(prev.engineKv[engine.deployment_id], { t: engine.ts, v: engine.kv_cache_usage_perc });
        }
        const latency = arrived - telemetry.ts * 1000;
        next.latenciesMs = [...prev.latenciesMs, latency].slice(-60);
        return next;
      });
    },
    [onOther],
  );
  const { connected } = useLive(extraGroups, handle);
  return { connected, ...state };
}
