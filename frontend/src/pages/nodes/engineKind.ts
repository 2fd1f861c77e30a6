// Each engine kind shown as it is: its name, its version as the host reported it, the settings its command
// line sets (in that engine's own terms), and "not reported" where it reports nothing.
import type { Deployment, DeploymentEvent, EngineLive } from "../../api/types";

type Engine = Deployment["engine"];
type LaunchRecord = NonNullable<DeploymentEvent["launch"]>;

export const NOT_REPORTED = "not reported";

export const ENGINE_LABELS: Record<Engine, string> = {
  vllm: "vLLM",
  llamacpp: "llama.cpp",
  sim: "vLLM simulator",
};

// What the version of each kind is the version of (llama.cpp runs as llama-cpp-python's server).
const VERSION_OF: Record<Engine, string> = {
  vllm: "vLLM",
  llamacpp: "llama-cpp-python",
  sim: "vLLM simulator",
};

export function engineLabel(engine: Engine): string {
  return ENGINE_LABELS[engine] ?? engine;
}

/** Whether the engine serves metrics: its live record says so; before one, its kind does (llama.cpp has none). */
export function reportsMetrics(engine: Engine | undefined, live: Pick<EngineLive, "has_metrics"> | null | undefined): boolean {
  if (live && live.has_metrics === false) return false;
  if (live) return true;
  return engine !== "llamacpp";
}

/** A figure of the live record: "—" before any record, "not reported" from an engine that serves no metrics. */
export function liveFigure<T>(
  live: EngineLive | null | undefined,
  pick: (live: EngineLive) => T | null | undefined,
  format: (value: T | null | undefined) => string,
): string {
  if (!live) return "—";
  if (live.has_metrics === false) return NOT_REPORTED;
  return format(pick(live));
}

/** "llama.cpp (llama-cpp-python 0.3.36)", "vLLM 0.11.0", or the kind with "version not reported". */
export function launchEngine(launch: LaunchRecord): string {
  const engine = launch.engine as Engine;
  // Records from before engine_version was kept: vLLM's version is the host's vLLM (not so for llama.cpp).
  const version = launch.engine_version ?? (engine === "llamacpp" ? null : launch.vllm_version);
  const label = engineLabel(engine);
  if (engine === "llamacpp") return `${label} (${VERSION_OF.llamacpp} ${version ?? NOT_REPORTED})`;
  return version ? `${label} ${version}` : `${label} (version ${NOT_REPORTED})`;
}

/** The value of a flag in a command line (`--flag value` or `--flag=value`), or null when absent. */
export function flagValue(argv: readonly string[], flag: string): string | null {
  for (const [i, arg] of argv.entries()) {
    if (arg === flag) return argv[i + 1] ?? "";
    if (arg.startsWith(`${flag}=`)) return arg.slice(flag.length + 1);
  }
  return null;
}

export interface EngineSetting {
  name: string;
  value: string;
}

function orDefault(value: string | number | null | undefined, fallback: string): string {
  return value === null || value === undefined || value === "" ? fallback : String(value);
}

/** The settings that apply to the deployment's engine kind, as its launch command (or, before one, its row) sets them. */
export function engineSettings(d: Deployment): EngineSetting[] {
  const argv = d.launch_argv.length ? d.launch_argv : [];
  if (d.engine === "llamacpp") {
    const own = (flag: string) => flagValue(argv, flag) ?? flagValue(d.extra_args, flag);
    // llama-cpp-python's server defaults (llama_cpp/server/settings.py) for the flags the console leaves out.
    return [
      { name: "GGUF file", value: orDefault(flagValue(argv, "--model"), "set at launch") },
      { name: "context size (n_ctx)", value: orDefault(own("--n_ctx") ?? d.max_model_len, "") },
      { name: "batch (n_batch)", value: orDefault(own("--n_batch") ?? d.max_num_batched_tokens, "llama-cpp-python's default (512)") },
      { name: "threads (n_threads)", value: orDefault(own("--n_threads"), "llama-cpp-python's default (half the CPU cores)") },
      { name: "GPU layers (n_gpu_layers)", value: orDefault(own("--n_gpu_layers"), "0, llama-cpp-python's default (CPU only; GPUs hidden)") },
      { name: "interrupt requests", value: orDefault(own("--interrupt_requests"), "false") },
      { name: "address", value: d.base_url },
    ];
  }
  const vllmDefault = d.engine === "sim" ? "the simulator's default (vLLM's)" : "vLLM's default";
  return [
    { name: "GPUs", value: d.gpu_indices.join(", ") || "none (CPU)" },
    { name: "gpu_memory_utilization", value: orDefault(d.gpu_memory_utilization, vllmDefault) },
    { name: "max_model_len", value: String(d.max_model_len) },
    { name: "block_size", value: orDefault(d.block_size, vllmDefault) },
    { name: "max_num_seqs", value: orDefault(d.max_num_seqs, vllmDefault) },
    { name: "tp", value: String(d.tensor_parallel_size) },
    { name: "pp", value: String(d.pipeline_parallel_size) },
    { name: "prefix caching", value: d.enable_prefix_caching ? "on" : "off" },
    { name: "address", value: d.base_url },
  ];
}
