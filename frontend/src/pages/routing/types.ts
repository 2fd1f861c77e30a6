// Shapes of the routing API (routing/api/serializers.py and views.py).

export type Scorer =
  | "round_robin"
  | "random"
  | "least_outstanding"
  | "best_fit"
  | "prefix_affinity"
  | "session_affinity"
  | "weighted";

export interface RoutePool {
  id: number;
  name: string;
  alias: string;
  role: string;
  scorer: Scorer;
  scorer_weights: Record<string, number>;
  session_header: string;
  connect_timeout_s: number;
  first_byte_timeout_s: number;
  total_timeout_s: number;
  max_retries: number;
  max_inflight_per_endpoint: number;
  /** Share (0..1) of the pool's capacity batch requests may fill; the rest is kept for interactive ones. */
  batch_max_fraction: number;
  updated_at: string;
}

export interface RuleMatch {
  alias?: string | string[];
  min_prompt_tokens?: number;
  max_prompt_tokens?: number;
  task?: string | string[];
  tenant?: string | string[];
  priority?: "interactive" | "batch";
}

export interface RouteRule {
  match?: RuleMatch;
  pool: string;
}

export interface RoutePolicy {
  id: number;
  name: string;
  alias: string;
  rules: RouteRule[];
  default_pool: string | null;
  fallback_pool: string | null;
  updated_at: string;
}

export interface TrafficRow {
  route_pool: string;
  deployment_id: number | null;
  upstream: string;
  requests: number;
  errors: number;
  tokens: number | null;
}

export interface RequestLogRow {
  id: number;
  created_at: string;
  request_id: string;
  tenant_id: number | null;
  tenant_name: string;
  key_prefix: string;
  endpoint_kind: string;
  alias: string;
  deployment_id: number | null;
  upstream: string;
  status: number;
  error_type: string;
  stream: boolean;
  priority: string;
  prompt_tokens: number | null;
  prompt_tokens_estimated: boolean;
  completion_tokens: number | null;
  ttft_ms: number | null;
  latency_ms: number | null;
  retries: number;
  route_pool: string;
  route_reason: string;
  prompt_text: string | null;
  response_text: string | null;
}

export interface CursorPage<T> {
  next: string | null;
  previous: string | null;
  results: T[];
}

export interface UsageBucket {
  hour: string;
  requests: number;
  errors: number;
  prompt_tokens: number;
  completion_tokens: number;
}

export const SCORERS: ReadonlyArray<{ value: Scorer; label: string }> = [
  { value: "least_outstanding", label: "Least outstanding" },
  { value: "best_fit", label: "Best fit (KV cache)" },
  { value: "prefix_affinity", label: "Prefix affinity" },
  { value: "session_affinity", label: "Session affinity" },
  { value: "weighted", label: "Weighted" },
  { value: "round_robin", label: "Round robin" },
  { value: "random", label: "Random" },
];

/** A rule's conditions in words, e.g. "task is summarize and prompt ≤ 6000 tokens". */
export function describeMatch(match: RuleMatch | undefined): string {
  if (!match) return "always";
  const list = (v: string | string[]) => (Array.isArray(v) ? v.join(" or ") : v);
  const parts: string[] = [];
  if (match.alias !== undefined) parts.push(`model is ${list(match.alias)}`);
  if (match.task !== undefined) parts.push(`task is ${list(match.task)}`);
  if (match.tenant !== undefined) parts.push(`tenant is ${list(match.tenant)}`);
  if (match.priority !== undefined) parts.push(`priority is ${match.priority}`);
  if (match.min_prompt_tokens !== undefined) parts.push(`prompt ≥ ${match.min_prompt_tokens} tokens`);
  if (match.max_prompt_tokens !== undefined) parts.push(`prompt ≤ ${match.max_prompt_tokens} tokens`);
  return parts.length ? parts.join(" and ") : "always";
}
