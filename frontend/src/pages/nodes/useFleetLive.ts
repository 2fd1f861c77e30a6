// Live fleet state from the WebSocket: the latest GPU samples and engine metrics per host, the last hour of
// them for the charts (history from the API, then live points), and the measured delay from a GPU sample on
// the agent to its arrival in this browser.
import { useCallback, useState } from "react";
import type { EngineLive, HostTelemetry } from "../../api/types";
import { useLive, type LiveEvent } from "../../hooks/useLive";
import { useTelemetrySeries, type TelemetrySeries } from "./telemetry";

export { gpuKey } from "./telemetry";

export interface FleetLive {
  connected: boolean;
  hosts: Record<string, HostTelemetry>;
  engines: Record<number, EngineLive>;
  /** The last hour of every GPU and engine, for the charts. */
  series: TelemetrySeries;
  /** Sample -> browser delays (ms) of the last events, newest last. */
  latenciesMs: number[];
  events: number;
}

interface Latest {
  hosts: Record<string, HostTelemetry>;
  engines: Record<number, EngineLive>;
  latenciesMs: number[];
  events: number;
}

const EMPTY: Latest = { hosts: {}, engines: {}, latenciesMs: [], events: 0 };

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
  const { series, add } = useTelemetrySeries();
  const handle = useCallback(
    (event: LiveEvent) => {
      if (event.type !== "host.telemetry") {
        onOther?.(event);
        return;
      }
      const telemetry = event as unknown as HostTelemetry;
      const arrived = Date.now();
      add(telemetry);
      setState((prev) => {
        const engines = { ...prev.engines };
        for (const engine of telemetry.engines) engines[engine.deployment_id] = engine;
        return {
          hosts: { ...prev.hosts, [telemetry.host]: telemetry },
          engines,
          latenciesMs: [...prev.latenciesMs, arrived - telemetry.ts * 1000].slice(-60),
          events: prev.events + 1,
        };
      });
    },
    [onOther, add],
  );
  const { connected } = useLive(extraGroups, handle);
  return { connected, series, ...state };
}
