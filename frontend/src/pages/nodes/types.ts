// Shapes of the nodes API (/api/hosts/, /api/deployments/) and of the live events the node agents push
// (nodes/agent/supervisor.py). Hand-written to match nodes/api/serializers.py.

export interface GpuSample {
  index: number;
  ts: number;
  simulated: boolean;
  utilization_pct: number;
  memory_used_bytes: number;
  memory_total_bytes: number;
  temperature_c: number;
  power_watts: number | null;
}

export interface Gpu {
  id: number;
  index: number;
  uuid: string;
  name: string;
  memory_total_bytes: number;
  simulated: boolean;
  last_seen: string | null;
  live: GpuSample | null;
}

export interface Host {
  id: number;
  name: string;
  address: string;
  role: string;
  labels: Record<string, string>;
  cost_per_hour: string;
  state: string;
  reachable: boolean;
  last_heartbeat: string | null;
  agent_info: { gpu_note?: string; nvml?: boolean; simulated_gpus?: boolean; heartbeat_seconds?: number };
  agent_queue: string;
  gpus: Gpu[];
  deployment_count: number;
}

export interface EngineLive {
  ts: number;
  deployment_id: number;
  host: string;
  name: string;
  served_model_name: string;
  engine: string;
  state: string;
  num_requests_running: number;
  num_requests_waiting: number;
  kv_cache_usage_perc: number;
  kv_cache_total_tokens: number | null;
  prompt_tokens_total: number;
  generation_tokens_total: number;
  tokens_per_s: number;
  ttft_p50_s: number | null;
  itl_p50_s: number | null;
  has_metrics: boolean;
}

export interface Deployment {
  id: number;
  name: string;
  model_version: number;
  model_version_label: string;
  quantization: number | null;
  engine: string;
  host: number;
  host_name: string;
  gpu_indices: number[];
  gpu_memory_utilization: number;
  max_model_len: number;
  block_size: number;
  max_num_seqs: number;
  max_num_batched_tokens: number | null;
  tensor_parallel_size: number;
  enable_prefix_caching: boolean;
  extra_args: string[];
  port: number;
  served_model_name: string;
  role: string;
  desired_state: string;
  state: string;
  state_reason: string;
  state_changed_at: string | null;
  pid: number | null;
  launch_argv: string[];
  started_at: string | null;
  ready_at: string | null;
  restart_count: number;
  next_restart_at: string | null;
  last_log_lines: string;
  base_url: string;
  live: EngineLive | null;
  created_at: string;
}

export interface DeploymentEvent {
  id: number;
  at: string;
  from_state: string;
  to_state: string;
  message: string;
  log_tail: string;
}

export interface FitStep {
  label: string;
  formula: string;
  value: number;
}

export interface FitResult {
  fits: boolean;
  reason: string;
  weight_bytes: number;
  kv_bytes_per_token: number;
  kv_tokens_available: number;
  max_context_that_fits: number;
  steps: FitStep[];
}

/** A `host.telemetry` event: one per host per agent tick. `ts` is the GPU sample time (unix seconds). */
export interface HostTelemetry {
  type: "host.telemetry";
  host: string;
  ts: number;
  simulated: boolean;
  gpu_note: string;
  gpus: GpuSample[];
  engines: EngineLive[];
}

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) return "—";
  const gib = bytes / 1024 ** 3;
  return gib >= 1 ? `${gib.toFixed(1)} GiB` : `${(bytes / 1024 ** 2).toFixed(0)} MiB`;
}

export function formatSeconds(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  return value < 1 ? `${(value * 1000).toFixed(0)} ms` : `${value.toFixed(2)} s`;
}

export function formatPct(fraction: number | null | undefined): string {
  if (fraction === null || fraction === undefined) return "—";
  return `${(fraction * 100).toFixed(0)}%`;
}

/** Seconds since an ISO time, for heartbeat ages. */
export function ageSeconds(iso: string | null): number | null {
  if (!iso) return null;
  return Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
}
