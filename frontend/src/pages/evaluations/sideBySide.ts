// What the side-by-side view shows, whatever it came from: an offline run's sample (two deployments on a
// suite's case, with tokens and their logprobs) or a shadow pair (the primary's live answer and the shadow
// candidate's, words only). Each maps to one SideBySideItem; SampleSideBySide renders only that.
import type { EvalSample, SampleMark, ShadowPair } from "../../api/types";
import { formatDateTime } from "../../format";

export interface SideView {
  output: string;
  /** The side's tokens in order, joined they give `output`; empty: show `output` as is. */
  tokens: string[];
  /** Per token (may be empty: then nothing is shaded). */
  logprobs: number[];
  /** Per position KL, shown in the tokens' titles (the reference side of a run only). */
  kl: number[] | null;
  correct: boolean | null;
  latencyMs: number | null;
  /** undefined where the source never measures it (a shadow pair). */
  ttftMs?: number | null;
}

export interface SideBySideReview {
  mark: SampleMark;
  comment: string;
  markedBy: string;
  markedAt: string;
}

export interface SideBySideItem {
  id: number;
  title: string;
  /** Beside the title, muted (a sample's position). */
  subtitle: string;
  tags: string[];
  prompt: string | null;
  messages: unknown;
  expected: { text: string; rule: string } | null;
  /** The whole item failed: nothing to compare, nothing to mark (an offline sample's failed requests). */
  error: string;
  /** Only the candidate failed (a shadow pair): the primary still shows, and the item can be marked. */
  candidateError: string;
  /** The two sides' names: "Reference" / "Candidate", or "Primary" / "Shadow candidate". */
  labels: { primary: string; candidate: string };
  primary: SideView;
  candidate: SideView;
  exactMatch: boolean | null;
  firstDivergence: number | null;
  /** What first_divergence counts. */
  unit: "token" | "word";
  flip: string;
  /** Metrics the source has; an undefined one is not shown at all (a pair has no KL). */
  tokenAgreement?: number | null;
  chrf: number | null;
  kl?: { mode: string; mean: number | null; max: number | null };
  top1Agreement?: number | null;
  review: SideBySideReview | null;
}

export function sampleItem(s: EvalSample): SideBySideItem {
  return {
    id: s.id,
    title: s.case_key,
    subtitle: `#${s.position + 1}`,
    tags: s.tags,
    prompt: s.prompt,
    messages: s.messages,
    expected: s.expected !== null ? { text: s.expected, rule: s.match_rule } : null,
    error: s.error,
    candidateError: "",
    labels: { primary: "Reference", candidate: "Candidate" },
    primary: {
      output: s.reference_output,
      tokens: s.reference_tokens,
      logprobs: s.reference_token_logprobs,
      kl: s.position_kl,
      correct: s.reference_correct,
      latencyMs: s.reference_latency_ms,
      ttftMs: s.reference_ttft_ms,
    },
    candidate: {
      output: s.candidate_output,
      tokens: s.candidate_tokens,
      logprobs: s.candidate_token_logprobs,
      kl: null,
      correct: s.candidate_correct,
      latencyMs: s.candidate_latency_ms,
      ttftMs: s.candidate_ttft_ms,
    },
    exactMatch: s.exact_match,
    firstDivergence: s.first_divergence,
    unit: "token",
    flip: s.flip,
    tokenAgreement: s.token_agreement,
    chrf: s.chrf,
    kl: { mode: s.kl_mode, mean: s.mean_kl, max: s.max_kl },
    top1Agreement: s.top1_agreement,
    review: s.review ? { mark: s.review.mark, comment: s.review.comment, markedBy: s.review.marked_by_name, markedAt: s.review.marked_at } : null,
  };
}

/** A text's words, each with the whitespace before it, so that they join back into the text (less any
 * trailing whitespace). A pair is scored with whitespace-separated words as its tokens
 * (routing.proxy.shadow.score_pair), so its first divergence indexes these. */
export function words(text: string): string[] {
  return text.match(/\s*\S+/g) ?? [];
}

const MARK_VALUES: ReadonlySet<string> = new Set<SampleMark>(["same", "acceptable", "regression"]);

export function pairItem(p: ShadowPair): SideBySideItem {
  const scores = (p.scores ?? {}) as Record<string, unknown>;
  const agreement = scores.token_agreement;
  return {
    id: p.id,
    title: p.request_id || `pair ${p.id}`,
    subtitle: formatDateTime(p.created_at),
    tags: [],
    prompt: p.prompt,
    messages: p.messages,
    expected: null,
    error: "",
    candidateError: p.candidate_error,
    labels: { primary: "Primary", candidate: "Shadow candidate" },
    primary: { output: p.primary_output, tokens: words(p.primary_output), logprobs: [], kl: null, correct: null, latencyMs: p.primary_latency_ms },
    candidate: {
      output: p.candidate_output,
      tokens: words(p.candidate_output),
      logprobs: [],
      kl: null,
      correct: null,
      latencyMs: p.candidate_latency_ms,
    },
    exactMatch: p.exact_match,
    firstDivergence: p.first_divergence,
    unit: "word",
    flip: "",
    tokenAgreement: typeof agreement === "number" ? agreement : null,
    chrf: p.chrf,
    review:
      p.mark && MARK_VALUES.has(p.mark)
        ? { mark: p.mark as SampleMark, comment: p.comment, markedBy: p.marked_by_name, markedAt: p.marked_at ?? "" }
        : null,
  };
}
