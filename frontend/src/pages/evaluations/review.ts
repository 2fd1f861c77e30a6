// Pure helpers of the run review page: labels, the token shading, the word diff and the keyboard map.
import { diffWords } from "diff";
import type { EvalRunState, SampleMark, VerdictDecision } from "../../api/types";

export const MARKS: ReadonlyArray<{ value: SampleMark; label: string; key: string; tone: "ok" | "info" | "bad" }> = [
  { value: "same", label: "Same", key: "1", tone: "ok" },
  { value: "acceptable", label: "Acceptable", key: "2", tone: "info" },
  { value: "regression", label: "Regression", key: "3", tone: "bad" },
];

export const FINISHED: ReadonlySet<EvalRunState> = new Set(["completed", "failed", "cancelled"]);

export const DECISION_LABEL: Record<VerdictDecision, string> = { accept: "accepted", reject: "rejected" };

/** The KL mode as the summary and the side-by-side view name it (docs/evaluations.md, "Distributions"). */
export function klModeLabel(mode: string): string {
  if (mode === "teacher_forced") return "teacher-forced";
  if (mode === "free_running_topk") return "free-running top-k (not teacher-forced)";
  return mode || "—";
}

export function flipLabel(flip: string): string {
  if (flip === "right_to_wrong") return "right → wrong";
  if (flip === "wrong_to_right") return "wrong → right";
  return "";
}

/** A token's background: the less likely the side found its own token, the darker. p = 1 is clear. */
export function tokenShade(logprob: number | undefined): string | undefined {
  if (logprob === undefined || !Number.isFinite(logprob)) return undefined;
  const p = Math.min(1, Math.exp(logprob));
  const alpha = Math.round((1 - p) * 0.75 * 100) / 100;
  return alpha > 0 ? `rgba(214, 120, 30, ${alpha})` : undefined;
}

export interface DiffPart {
  text: string;
  kind: "same" | "removed" | "added";
}

/** The word-level diff of the two outputs (jsdiff's diffWords): reference -> candidate. */
export function wordDiff(reference: string, candidate: string): DiffPart[] {
  return diffWords(reference, candidate).map((change) => ({
    text: change.value,
    kind: change.added ? "added" : change.removed ? "removed" : "same",
  }));
}

export type ReviewKey = { kind: "next" } | { kind: "previous" } | { kind: "mark"; mark: SampleMark };

/** j / k move through the sample list, 1 / 2 / 3 mark the open sample; null for any other key, and for
 * keys typed into a form field or pressed with a modifier. */
export function reviewKey(event: KeyboardEvent): ReviewKey | null {
  if (event.ctrlKey || event.metaKey || event.altKey) return null;
  const target = event.target as HTMLElement | null;
  if (target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName))) return null;
  if (event.key === "j") return { kind: "next" };
  if (event.key === "k") return { kind: "previous" };
  const mark = MARKS.find((m) => m.key === event.key);
  return mark ? { kind: "mark", mark: mark.value } : null;
}

export function formatFixed(value: number | null | undefined, digits = 3): string {
  return value === null || value === undefined ? "—" : value.toFixed(digits);
}

/** A 0..1 rate as a percentage with one decimal. */
export function formatRate(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : `${(value * 100).toFixed(1)}%`;
}

/** A difference of rates in percentage points, signed: "+2.0 pp". */
export function formatPoints(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  const points = value * 100;
  return `${points > 0 ? "+" : points < 0 ? "−" : "±"}${Math.abs(points).toFixed(1)} pp`;
}

export function formatMs(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  return value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`;
}
