// Shapes of the model registry API (models_registry/api/serializers.py).

export interface ModelFamily {
  id: number;
  name: string;
  architecture: string;
  task_tags: string[];
  description: string;
  version_count: number;
  created_at: string;
}

export type VersionState = "registered" | "verified" | "failed";

export interface ModelVersion {
  id: number;
  model: number;
  model_name: string;
  revision: string;
  source_kind: "directory" | "gguf";
  source_path: string;
  parameter_count: number | null;
  max_context: number | null;
  architecture: Record<string, unknown>;
  tokenizer_path: string | null;
  state: VersionState;
  manifest_digest: string;
  file_count: number;
  total_bytes: number;
  parent: number | null;
  parent_label: string | null;
  quantization: number | null;
  quantization_name: string | null;
  aliases: string[];
  created_at: string;
}

export interface ManifestFile {
  path: string;
  size: number;
  sha256: string;
}

export interface Problem {
  path: string;
  kind: "mismatch" | "missing" | "extra" | "unreadable";
  expected: string | null;
  actual: string | null;
  detail: string;
}

export interface VerificationRun {
  id: number;
  version: number;
  host_name: string;
  ok: boolean;
  manifest_digest: string;
  problems: Problem[];
  files_checked: number;
  bytes_hashed: number;
  cache_hits: number;
  trigger: string;
  started_at: string;
  finished_at: string | null;
}

export interface QuantizationConfig {
  id: number;
  name: string;
  method: string;
  bits: number;
  group_size: number | null;
  kv_cache_dtype: string;
  description: string;
  created_at: string;
}

export interface ModelAlias {
  id: number;
  name: string;
  active_version: number;
  active_version_label: string;
  active_version_state: VersionState;
  task_tags: string[];
  description: string;
  updated_at: string;
}

export interface LineageNode {
  id: number;
  label: string;
  model: number;
  revision: string;
  state: VersionState;
  quantization: string | null;
  method: string | null;
  children: LineageNode[];
}

export interface FitStep {
  label: string;
  formula: string;
  value: number;
}

export interface FitResult {
  fits: boolean;
  reason: string;
  parameter_count: number;
  weight_bytes: number;
  kv_bytes_per_token: number;
  kv_tokens_available: number;
  max_context_that_fits: number;
  full_length_sequences: number;
  budget_bytes: number;
  kv_cache_bytes: number;
  steps: FitStep[];
}

export const QUANT_METHODS = [
  "none", "fp16", "bf16", "fp8", "int8", "awq", "gptq",
  "gguf-q2_k", "gguf-q3_k", "gguf-q4_0", "gguf-q4_1", "gguf-q4_k", "gguf-q5_0", "gguf-q5_1", "gguf-q5_k", "gguf-q6_k", "gguf-q8_0",
] as const;

export const KV_DTYPES = ["auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp32"] as const;

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 2)} ${units[unit]}`;
}

export function formatParams(count: number | null | undefined): string {
  if (!count) return "—";
  if (count >= 1e9) return `${(count / 1e9).toFixed(2)} B`;
  if (count >= 1e6) return `${(count / 1e6).toFixed(1)} M`;
  return count.toLocaleString();
}
