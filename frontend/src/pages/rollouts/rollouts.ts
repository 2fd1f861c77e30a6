// Pure helpers of the Rollouts page: the plan's text form, gate series for the charts, state tones.
import type { GateInfo, GatePoint, GateSeries, RolloutState, StepMetric } from "../../api/types";
import type { BadgeTone } from "../../components/StatusBadge";

export const STATE_TONES: Record<RolloutState, BadgeTone> = {
  running: "ok",
  paused: "warn",
  holding: "warn",
  awaiting_approval: "warn",
  promoted: "info",
  rolled_back: "bad",
  cancelled: "off",
};

export const ACTIVE_STATES: RolloutState[] = ["running", "paused", "holding", "awaiting_approval"];

/** "1, 5, 25, 50, 100" -> [1, 5, 25, 50, 100]; null (with the bad part) when a part is not a number. */
export function parseSteps(text: string): { steps: number[] } | { bad: string } {
  const parts = text.split(/[\s,;]+/).filter((p) => p && p !== "->");
  const steps: number[] = [];
  for (const part of parts) {
    const value = Number(part.replace(/%$/, ""));
    if (!Number.isFinite(value)) return { bad: part };
    steps.push(value);
  }
  return { steps };
}

export const GATE_FIELDS: Array<{ key: string; label: string; hint: string }> = [
  { key: "max_error_rate_delta", label: "Max error-rate delta", hint: "candidate minus baseline, e.g. 0.02" },
  { key: "max_p95_latency_ratio", label: "Max p95 latency ratio", hint: "candidate / baseline, e.g. 1.5" },
  { key: "max_ttft_p95_ratio", label: "Max p95 TTFT ratio", hint: "candidate / baseline, e.g. 1.5" },
  { key: "max_flip_rate", label: "Max flip rate", hint: "shadow or signed-off run, e.g. 0.05" },
  { key: "min_chrf", label: "Min chrF", hint: "0-100, e.g. 80" },
  { key: "min_exact_match_rate", label: "Min exact-match rate", hint: "0-1" },
  { key: "max_kl", label: "Max mean KL", hint: "nats, from the signed-off run" },
  { key: "ttft_tolerance", label: "TTFT tolerance (statistical)", hint: "relative shift vs baseline, e.g. 0.05" },
  { key: "latency_tolerance", label: "Latency tolerance (statistical)", hint: "relative shift vs baseline, e.g. 0.05" },
  { key: "error_rate_tolerance", label: "Error-rate tolerance (statistical)", hint: "points above baseline, e.g. 0.01" },
  { key: "shadow_min_exact_match_rate", label: "Min exact-match rate (shadow pairs)", hint: "the step's pairs, 0-1" },
  { key: "shadow_min_chrf", label: "Min chrF (shadow pairs)", hint: "the step's pairs, 0-100" },
  { key: "shadow_max_flip_rate", label: "Max flip rate (shadow pairs)", hint: "graded pairs, 0-1" },
  { key: "shadow_max_kl", label: "Max mean KL (shadow pairs)", hint: "pairs with a KL, nats" },
];

/** The analysis's limits as typed in the start dialog: empty fields are left out (the defaults apply). */
export const LIMIT_FIELDS: Array<{ key: "failure_limit" | "inconclusive_limit" | "consecutive_error_limit" | "min_samples"; label: string; hint: string }> = [
  { key: "failure_limit", label: "Failure limit", hint: "failed measurements allowed per step (default 0)" },
  { key: "inconclusive_limit", label: "Inconclusive limit", hint: "then pause for a person (default: none)" },
  { key: "consecutive_error_limit", label: "Consecutive-error limit", hint: "errors in a row allowed (default 4)" },
  { key: "min_samples", label: "Min samples", hint: "statistical and shadow gates (default 20)" },
];

/** One gate's measurement in a step, in words: its value against the threshold and its counts. */
export function metricSummary(m: StepMetric): string {
  const value = m.value === null || m.value === undefined ? "n/a" : String(Number(m.value.toFixed(4)));
  const threshold = m.threshold === null || m.threshold === undefined ? "" : ` ${m.bound === "max" ? "≤" : "≥"} ${m.threshold}`;
  const c = m.counts;
  const inconclusive = m.inconclusive_limit === null || m.inconclusive_limit === undefined ? "" : `/${m.inconclusive_limit}`;
  return `${value} (needs${threshold}); failed ${c.failed}/${m.failure_limit}, inconclusive ${c.inconclusive}${inconclusive}, errors ${c.consecutive_errors}/${m.consecutive_error_limit} in a row, ${c.measurements} measured`;
}

export const OUTCOME_TONES: Record<string, BadgeTone> = {
  Successful: "ok",
  Failed: "bad",
  Inconclusive: "warn",
  Error: "bad",
};

/** A statistical gate's latest judgement in words (the last evaluation that judged it), or null. */
export function latestDetail(series: GateSeries, key: string): string | null {
  for (let i = series.points.length - 1; i >= 0; i--) {
    const detail = series.points[i]?.details?.[key];
    if (detail) return detail;
  }
  return null;
}

/** One gate's chart: its values at each point (evaluations and decisions) and its threshold as a line. */
export function gateChart(series: GateSeries, gate: GateInfo): { t: number[]; values: (number | null)[]; threshold: number[] } {
  const points = series.points.filter((p: GatePoint) => gate.key in p.values);
  return {
    t: points.map((p) => Date.parse(p.t) / 1000),
    values: points.map((p) => p.values[gate.key] ?? null),
    threshold: points.map(() => gate.threshold),
  };
}

/** The latest value of a gate, for the table beside the charts. */
export function latestValue(series: GateSeries, key: string): number | null {
  for (let i = series.points.length - 1; i >= 0; i--) {
    const value = series.points[i]?.values[key];
    if (value !== undefined && value !== null) return value;
  }
  return null;
}

export function formatShare(value: number): string {
  return `${Number(value.toFixed(2))}%`;
}
