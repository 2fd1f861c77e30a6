import { useCallback, useEffect, useState } from "react";
import { Link, useParams } from "react-router-dom";
import { api, errorMessage } from "../../api/client";
import type { Deployment, DeploymentEvent, DeploymentLog, DeploymentState, EngineLive, HostTelemetry } from "../../api/types";
import { useAuth } from "../../auth";
import { DeploymentCostCard } from "../../components/Cost";
import { ConfirmDialog } from "../../components/Dialog";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { formatBytes, formatDateTime, formatPct, formatSeconds } from "../../format";
import { useApi } from "../../hooks/useApi";
import type { LiveEvent } from "../../hooks/useLive";
import { useLive } from "../../hooks/useLive";
import { BaselinePanel } from "./BaselinePanel";
import { DeploymentHistory } from "./DeploymentHistory";
import { engineLabel, engineSettings, launchEngine, liveFigure, NOT_REPORTED, reportsMetrics } from "./engineKind";
import { LogTail } from "./LogTail";
import { EngineKvCacheChart, EngineLatencyChart, EngineRequestsChart, EngineThroughputChart, GpuUtilizationChart } from "./charts";
import "./nodes.css";
import { gpuKey, useTelemetrySeries } from "./telemetry";

type Action = "start" | "stop" | "restart" | "drain" | "sleep" | "wake";

// Start launches an engine that is not running; while one runs (or is on its way up or down), it is disabled.
// A crashed engine waiting for its restart may be started at once.
const STARTABLE: ReadonlySet<DeploymentState> = new Set(["stopped", "failed", "crashed"]);

/** One deployment: state timeline, launch command, live metrics, log tail and actions. */
export function DeploymentDetailPage() {
  const { id } = useParams();
  const { isAdmin } = useAuth();
  const deployment = useApi<Deployment>(`/api/deployments/${id}/`);
  const events = useApi<DeploymentEvent[]>(`/api/deployments/${id}/events/`);
  const [logs, setLogs] = useState<DeploymentLog | null>(null);
  const [live, setLive] = useState<EngineLive | null>(null);
  const telemetry = useTelemetrySeries({ deployment: id });
  const [confirm, setConfirm] = useState<Action | null>(null);
  const [actionError, setActionError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const loadLogs = useCallback(() => {
    api
      .get<DeploymentLog>(`/api/deployments/${id}/logs/`, { lines: 200 })
      .then(setLogs)
      .catch(() => undefined);
  }, [id]);

  useEffect(() => {
    loadLogs();
    const timer = setInterval(loadLogs, 3000);
    return () => clearInterval(timer);
  }, [loadLogs]);

  const { add } = telemetry;
  const onEvent = useCallback(
    (event: LiveEvent) => {
      if (event.type === "host.telemetry") {
        add(event as unknown as HostTelemetry);
      } else if (event.type === "deployment.metrics" && String(event.deployment_id) === id) {
        setLive(event as unknown as EngineLive);
      } else if (event.type === "deployment.state" && String(event.deployment_id) === id) {
        deployment.reload();
        events.reload();
      }
    },
    [id, deployment, events, add],
  );
  const { connected } = useLive([`live.deployment.${id}`], onEvent);

  const act = async (action: Action) => {
    setBusy(true);
    setActionError(null);
    try {
      await api.post(`/api/deployments/${id}/${action}/`, {});
      setConfirm(null);
      deployment.reload();
      events.reload();
    } catch (err) {
      setActionError(errorMessage(err));
    } finally {
      setBusy(false);
    }
  };

  const d = deployment.data;
  const metrics = live ?? d?.live ?? null;
  const engineSeries = d ? telemetry.series.engines[d.id] : undefined;
  const startable = d ? STARTABLE.has(d.state) : false;
  // Sleep needs an engine started with sleep mode (the flag is in its launch command).
  const sleepMode = d ? d.launch_argv.includes("--enable-sleep-mode") : false;
  const sleepable = d ? d.state === "ready" && sleepMode : false;
  const hasMetrics = reportsMetrics(d?.engine, metrics);
  return (
    <Page
      title={d ? d.name : "Deployment"}
      subtitle={d && `${d.model_version_label} on ${d.host_name} as ${d.served_model_name} (${engineLabel(d.engine)})`}
      actions={
        <>
          <span className={connected ? "live live-on" : "live"}>{connected ? "live" : "connecting…"}</span>
          {isAdmin && d && (
            <>
              <button
                type="button"
                className="btn"
                onClick={() => setConfirm("start")}
                disabled={!startable}
                title={startable ? "Launch the engine" : `Already ${d.state}: stop it first, or restart it.`}
                data-testid="action-start"
              >
                Start
              </button>
              <button
                type="button"
                className="btn"
                onClick={() => setConfirm("sleep")}
                disabled={!sleepable}
                title={
                  sleepable
                    ? `Free its GPU memory (level ${d.sleep_level}); the first request wakes it`
                    : sleepMode
                      ? `Only a ready engine can sleep (it is ${d.state}).`
                      : "Runs without sleep mode: enable sleep on it (or its pool) and restart it."
                }
                data-testid="action-sleep"
              >
                Sleep
              </button>
              <button
                type="button"
                className="btn"
                onClick={() => setConfirm("wake")}
                disabled={d.state !== "sleeping"}
                title={d.state === "sleeping" ? "Bring the engine back to ready" : "It is not asleep."}
                data-testid="action-wake"
              >
                Wake
              </button>
              <button type="button" className="btn" onClick={() => setConfirm("restart")} data-testid="action-restart">Restart</button>
              <button type="button" className="btn" onClick={() => setConfirm("drain")} data-testid="action-drain">Drain</button>
              <button type="button" className="btn btn-danger" onClick={() => setConfirm("stop")} data-testid="action-stop">Stop</button>
            </>
          )}
        </>
      }
    >
      <p>
        <Link to="/nodes">← Nodes</Link>
      </p>
      <ErrorState error={deployment.error} onRetry={deployment.reload} />
      {actionError && <div className="notice notice-bad">{actionError}</div>}
      {d && (
        <>
          <div className="grid-3">
            <Card title="State">
              <div data-testid="deployment-state" data-state={d.state}>
                <StatusBadge status={d.state} /> <span className="muted">desired: {d.desired_state}</span>
              </div>
              <p>{d.state_reason}</p>
              {d.state === "sleeping" && (
                <p data-testid="sleep-info">
                  Asleep at level {d.sleeping_level} ({d.sleeping_level === 1 ? "weights in host memory, KV cache freed" : "weights and KV cache dropped"}) ·{" "}
                  <strong data-testid="freed-memory">{formatBytes(d.freed_memory_bytes)}</strong> of GPU memory freed
                </p>
              )}
              {d.sleep_enabled && (
                <div className="muted" data-testid="sleep-setting">
                  sleep mode on · {d.sleep_idle_seconds === null ? "no idle sleep of its own" : `sleeps after ${d.sleep_idle_seconds} s idle`} at level{" "}
                  {d.sleep_level}
                </div>
              )}
              <div className="muted" data-testid="deployment-restarts">
                pid {d.pid ?? "—"} ·{" "}
                <span title="Restarts after a crash, over the deployment's life">
                  restarts <strong data-testid="restarts-total">{d.restarts_total}</strong> in all
                </span>{" "}
                ·{" "}
                <span title="Restarts in a row that did not stay up; reset after a stable run or a start">
                  <strong data-testid="restart-streak">{d.restart_count}</strong> in a row
                </span>
                {d.next_restart_at && <> · next restart {formatDateTime(d.next_restart_at)}</>}
              </div>
            </Card>
            <Card title="Load">
              <div data-testid="deployment-load">
                running {liveFigure(metrics, (m) => m.num_requests_running, (v) => String(v ?? "—"))} · waiting{" "}
                {liveFigure(metrics, (m) => m.num_requests_waiting, (v) => String(v ?? "—"))} · KV cache{" "}
                <span data-testid="deployment-kv">{liveFigure(metrics, (m) => m.kv_cache_usage_perc, formatPct)}</span>
              </div>
              {!hasMetrics && (
                <div className="muted" data-testid="no-metrics">
                  {engineLabel(d.engine)} serves no metrics: its load and speed are not reported.
                </div>
              )}
            </Card>
            <Card title="Speed">
              <div data-testid="deployment-tps">{liveFigure(metrics, (m) => m.tokens_per_s, (v) => `${(v ?? 0).toFixed(0)} tokens/s`)}</div>
              <div>
                TTFT p50 {liveFigure(metrics, (m) => m.ttft_p50_s, formatSeconds)} · ITL p50 {liveFigure(metrics, (m) => m.itl_p50_s, formatSeconds)}
              </div>
            </Card>
          </div>
          <DeploymentCostCard deploymentId={String(d.id)} />
          <div style={{ height: 16 }} />
          <Card title="Metrics" testId="deployment-charts">
            <div className="chart-grid">
              {hasMetrics ? (
                <>
                  <EngineThroughputChart series={engineSeries} testId="deployment-tps-chart" />
                  <EngineRequestsChart series={engineSeries} testId="deployment-requests-chart" />
                  <EngineKvCacheChart series={engineSeries} testId="deployment-kv-chart" />
                  <EngineLatencyChart series={engineSeries} testId="deployment-latency-chart" />
                </>
              ) : (
                <p className="muted" data-testid="engine-charts-not-reported">
                  Throughput, requests, KV cache and latency: {NOT_REPORTED} ({engineLabel(d.engine)} serves no metrics).
                </p>
              )}
              {d.gpu_indices.map((index) => (
                <GpuUtilizationChart
                  key={index}
                  series={telemetry.series.gpus[gpuKey(d.host_name, { index })]}
                  testId={`deployment-gpu-${index}-chart`}
                />
              ))}
            </div>
          </Card>
          <div style={{ height: 16 }} />
          <DeploymentHistory deployment={d} />
          <div style={{ height: 16 }} />
          <BaselinePanel deploymentId={String(id)} isAdmin={isAdmin} />
          <div style={{ height: 16 }} />
          <Card title="Launch command">
            {d.members.length > 0 && (
              <div data-testid="deployment-hosts">
                {d.multi_host_backend === "mp"
                  ? `Hosts (pipeline stages, vLLM multiprocessing, no Ray): ${d.host_name} (stage 0, API server, master port ${d.master_port ?? 29501}, GPUs ${d.gpu_indices.join(", ")})`
                  : `Hosts (pipeline stages, over Ray): ${d.host_name} (stage 0, Ray head, GPUs ${d.gpu_indices.join(", ")})`}
                {d.members.map((m) => ` → ${m.host_name} (stage ${m.stage}, GPUs ${(m.gpu_indices ?? []).join(", ")})`).join("")}
              </div>
            )}
            <pre className="argv" data-testid="launch-argv">{d.launch_argv.length ? d.launch_argv.join(" ") : "Not launched yet."}</pre>
            <div className="muted engine-settings" data-testid="engine-settings" data-engine={d.engine}>
              <strong>{engineLabel(d.engine)}</strong>
              {engineSettings(d).map((s) => (
                <span key={s.name} data-testid="engine-setting">
                  {s.name} <code>{s.value}</code>
                </span>
              ))}
            </div>
            <div data-testid="quantization-kernel">
              Quantization kernel:{" "}
              {d.reported_quantization
                ? d.reported_quantization
                : d.engine === "vllm"
                  ? "none reported by the engine (unquantized, or not started yet)"
                  : "not reported (only vLLM logs its kernel; the simulator and llama.cpp do not)"}
              {d.quantization_override && <span className="muted"> · forced with --quantization {d.quantization_override}</span>}
            </div>
          </Card>
          {d.last_log_lines && d.state !== "ready" && (
            <>
              <div style={{ height: 16 }} />
              <Card title="Last log lines at exit">
                <pre className="log-tail" data-testid="exit-log">{d.last_log_lines}</pre>
              </Card>
            </>
          )}
          <div style={{ height: 16 }} />
          <div className="grid-2">
            <Card title="Timeline" testId="timeline">
              <ul className="timeline">
                {(events.data ?? []).map((e) => (
                  <li key={e.id}>
                    <time>{formatDateTime(e.at)}</time>
                    {e.from_state !== e.to_state ? (
                      <>
                        <StatusBadge status={e.from_state || "new"} /> → <StatusBadge status={e.to_state} />
                      </>
                    ) : (
                      <StatusBadge status={e.to_state} />
                    )}{" "}
                    {e.message}
                    {e.launch && (
                      <details className="launch-record" data-testid="launch-record">
                        <summary>
                          Launch record{e.launch.simulated && e.launch.engine !== "llamacpp" ? " (simulated)" : ""}:{" "}
                          <span data-testid="launch-engine">{launchEngine(e.launch)}</span>
                          {e.launch.engine === "llamacpp" ? (
                            " · CPU (GPUs hidden from it)"
                          ) : (
                            <>
                              {" "}
                              · driver {e.launch.driver_version ?? (e.launch.simulated_gpus ? "simulated GPUs" : NOT_REPORTED)} · CUDA{" "}
                              {e.launch.cuda_driver_version ?? (e.launch.simulated_gpus ? "simulated GPUs" : NOT_REPORTED)}
                            </>
                          )}
                        </summary>
                        <div>
                          manifest <code>{e.launch.manifest_digest || "none"}</code>
                        </div>
                        <div>
                          env{" "}
                          {Object.entries(e.launch.env)
                            .map(([k, v]) => `${k}=${v}`)
                            .join(" ")}
                        </div>
                        <pre className="argv">{e.launch.argv.join(" ")}</pre>
                      </details>
                    )}
                  </li>
                ))}
              </ul>
            </Card>
            <Card
              title={`Log tail${logs?.source === "last_exit" ? " (from the last exit)" : logs?.source === "agent" ? " (from the host's agent)" : ""}`}
              actions={
                <a className="btn btn-small" href={`/api/deployments/${id}/log-download/`} download data-testid="log-download">
                  Download log
                </a>
              }
            >
              <LogTail lines={logs?.lines ?? []} empty="No log yet." />
            </Card>
          </div>
        </>
      )}
      <ConfirmDialog
        title={confirm ? `${confirm.charAt(0).toUpperCase()}${confirm.slice(1)} ${d?.name ?? ""}` : ""}
        open={confirm !== null}
        message={
          confirm === "sleep"
            ? `Put the engine to sleep at level ${d?.sleep_level ?? 1}: its GPU memory is freed, the process and its port stay; the first request routed to it wakes it.`
            : confirm === "wake"
              ? "Wake the engine: its weights come back to the GPU and it serves again."
              : confirm === "drain"
            ? "Stop routing new requests to this engine and stop it once in-flight requests finish."
            : confirm === "stop"
              ? "Stop the engine now (SIGTERM, then SIGKILL after the stop timeout)."
              : confirm === "restart"
                ? "Stop the engine and launch it again with a new engine key."
                : "Launch the engine on its host."
        }
        confirmLabel={confirm ?? ""}
        danger={confirm === "stop"}
        busy={busy}
        error={actionError}
        onConfirm={() => confirm && act(confirm)}
        onClose={() => setConfirm(null)}
      />
    </Page>
  );
}
