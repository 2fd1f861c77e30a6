// Routing words for the console: scorer names and a rule's conditions in a sentence.
import type { RuleMatch, Scorer } from "../../api/types";

export const SCORERS: ReadonlyArray<{ value: Scorer; label: string }> = [
  { value: "least_outstanding", label: "Least outstanding" },
  { value: "best_fit", label: "Best fit (KV cache)" },
  { value: "prefix_affinity", label: "Prefix affinity" },
  { value: "session_affinity", label: "Session affinity" },
  { value: "weighted", label: "Weighted" },
  { value: "predicted_latency", label: "Predicted latency (learnt)" },
  { value: "slo_cost", label: "Cheapest meeting the SLO class" },
  { value: "round_robin", label: "Round robin" },
  { value: "random", label: "Random" },
];

/** A rule's conditions in words, e.g. "task is summarize and prompt ≤ 6000 tokens". */
export function describeMatch(match: RuleMatch | undefined): string {
  if (!match) return "always";
  const list = (v: unknown) => (Array.isArray(v) ? v.join(" or ") : String(v));
  const parts: string[] = [];
  if (match.alias !== undefined) parts.push(`model is ${list(match.alias)}`);
  if (match.task !== undefined) parts.push(`task is ${list(match.task)}`);
  if (match.tenant !== undefined) parts.push(`tenant is ${list(match.tenant)}`);
  if (match.priority !== undefined) parts.push(`priority is ${match.priority}`);
  if (match.min_prompt_tokens !== undefined) parts.push(`prompt ≥ ${match.min_prompt_tokens} tokens`);
  if (match.max_prompt_tokens !== undefined) parts.push(`prompt ≤ ${match.max_prompt_tokens} tokens`);
  return parts.length ? parts.join(" and ") : "always";
}
