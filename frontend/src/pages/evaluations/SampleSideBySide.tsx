// One sample of a run side by side: the word diff of the two outputs, each side's tokens shaded by how
// likely that side found them with the first divergence marked, the sample's metrics, and its review mark.
import type { EvalSample, SampleMark } from "../../api/types";
import { StatusBadge } from "../../components/StatusBadge";
import { formatDateTime } from "../../format";
import { MARKS, flipLabel, formatFixed, formatMs, klModeLabel, tokenShade, wordDiff } from "./review";

interface Props {
  sample: EvalSample;
  canReview: boolean;
  comment: string;
  onComment: (comment: string) => void;
  onMark: (mark: SampleMark) => void;
  onClear: () => void;
  saving: boolean;
  error: string | null;
}

export function SampleSideBySide({ sample, canReview, comment, onComment, onMark, onClear, saving, error }: Props) {
  const s = sample;
  const divergence = s.first_divergence;
  return (
    <div className="sample-view" data-testid="sample-view" data-sample={s.id}>
      <div className="sample-head">
        <div>
          <strong data-testid="sample-case">{s.case_key}</strong> <span className="muted">#{s.position + 1}</span>{" "}
          {s.tags.map((tag) => (
            <span key={tag} className="tag">
              {tag}
            </span>
          ))}
        </div>
        <div className="sample-badges">
          {s.error ? (
            <StatusBadge status="error" label="request failed" />
          ) : s.exact_match ? (
            <StatusBadge status="same" tone="ok" label="identical outputs" />
          ) : (
            <StatusBadge status="differs" tone="warn" label="outputs differ" />
          )}
          {s.flip && <StatusBadge status={s.flip} tone={s.flip === "right_to_wrong" ? "bad" : "ok"} label={flipLabel(s.flip)} />}
        </div>
      </div>

      <div className="sample-prompt">
        <span className="muted">Prompt</span>
        <pre className="sample-text">{s.messages ? JSON.stringify(s.messages, null, 2) : s.prompt}</pre>
        {s.expected !== null && (
          <div className="muted">
            Expected <code>{s.expected}</code> ({s.match_rule})
          </div>
        )}
      </div>

      {s.error ? (
        <div className="notice notice-bad">{s.error}</div>
      ) : (
        <>
          <div className="sample-diff" data-testid="word-diff">
            <div className="muted sample-label">
              Word diff, reference → candidate: <del className="diff-del">only in the reference</del>{" "}
              <ins className="diff-ins">only in the candidate</ins>
            </div>
            <p className="sample-text" data-testid="word-diff-text">
              {wordDiff(s.reference_output, s.candidate_output).map((part, index) =>
                part.kind === "removed" ? (
                  <del key={index} className="diff-del">
                    {part.text}
                  </del>
                ) : part.kind === "added" ? (
                  <ins key={index} className="diff-ins">
                    {part.text}
                  </ins>
                ) : (
                  <span key={index}>{part.text}</span>
                ),
              )}
            </p>
          </div>
          <div className="grid-2 sample-sides">
            <Side
              title="Reference"
              testId="reference-tokens"
              correct={s.reference_correct}
              tokens={s.reference_tokens}
              logprobs={s.reference_token_logprobs}
              kl={s.position_kl}
              divergence={divergence}
              text={s.reference_output}
            />
            <Side
              title="Candidate"
              testId="candidate-tokens"
              correct={s.candidate_correct}
              tokens={s.candidate_tokens}
              logprobs={s.candidate_token_logprobs}
              kl={null}
              divergence={divergence}
              text={s.candidate_output}
            />
          </div>
          <p className="muted sample-legend">
            Shading: the darker a token, the less likely its own side found it (1 − p).{" "}
            {divergence === null ? (
              "The two token sequences are equal."
            ) : (
              <>
                <span className="divergence-mark">▍</span> marks where they part: token {divergence}; the tokens after it are underlined.
              </>
            )}
          </p>
          <dl className="props sample-metrics" data-testid="sample-metrics">
            <dt>First divergence</dt>
            <dd>{divergence ?? "none"}</dd>
            <dt>Token agreement</dt>
            <dd>{formatFixed(s.token_agreement)}</dd>
            <dt>chrF</dt>
            <dd>{formatFixed(s.chrf, 1)}</dd>
            <dt>Mean KL</dt>
            <dd>
              {formatFixed(s.mean_kl, 4)} nats {s.kl_mode && <span className="muted">({klModeLabel(s.kl_mode)}; max {formatFixed(s.max_kl, 4)})</span>}
            </dd>
            <dt>Top-1 agreement</dt>
            <dd>{formatFixed(s.top1_agreement)}</dd>
            <dt>Latency</dt>
            <dd title="reference → candidate">
              {formatMs(s.reference_latency_ms)} → {formatMs(s.candidate_latency_ms)}{" "}
              <span className="muted">
                (TTFT {formatMs(s.reference_ttft_ms)} → {formatMs(s.candidate_ttft_ms)})
              </span>
            </dd>
          </dl>
        </>
      )}

      <div className="sample-review" data-testid="sample-review">
        <div className="sample-review-row">
          <span className="muted">Review</span>
          {s.review ? (
            <span data-testid="sample-mark" data-mark={s.review.mark}>
              <StatusBadge status={s.review.mark} tone={MARKS.find((m) => m.value === s.review?.mark)?.tone} />{" "}
              <span className="muted">
                by {s.review.marked_by_name}, {formatDateTime(s.review.marked_at)}
              </span>
            </span>
          ) : (
            <span className="muted" data-testid="sample-mark" data-mark="">
              not marked
            </span>
          )}
        </div>
        {!canReview && s.review?.comment && <p className="sample-comment">{s.review.comment}</p>}
        {canReview && !s.error && (
          <>
            <div className="field sample-comment-field">
              <label htmlFor="sample-comment">Comment</label>
              <textarea id="sample-comment" value={comment} onChange={(e) => onComment(e.target.value)} placeholder="Why (optional); saved with the mark" />
            </div>
            <div className="mark-buttons">
              {MARKS.map((m) => (
                <button
                  key={m.value}
                  type="button"
                  className={`btn mark-${m.value}`}
                  aria-pressed={s.review?.mark === m.value}
                  disabled={saving}
                  onClick={() => onMark(m.value)}
                >
                  {m.label} <kbd>{m.key}</kbd>
                </button>
              ))}
              {s.review && (
                <button type="button" className="btn btn-small" disabled={saving} onClick={onClear}>
                  Clear mark
                </button>
              )}
            </div>
            {error && (
              <div className="form-error" role="alert">
                {error}
              </div>
            )}
          </>
        )}
      </div>
    </div>
  );
}

interface SideProps {
  title: string;
  testId: string;
  correct: boolean | null;
  tokens: string[];
  logprobs: number[];
  kl: number[] | null;
  divergence: number | null;
  text: string;
}

function Side({ title, testId, correct, tokens, logprobs, kl, divergence, text }: SideProps) {
  return (
    <div className="sample-side">
      <div className="sample-label">
        <strong>{title}</strong>{" "}
        {correct !== null && <StatusBadge status={correct ? "right" : "wrong"} tone={correct ? "ok" : "bad"} />}
      </div>
      <p className="sample-text tokens" data-testid={testId}>
        {tokens.length === 0
          ? text
          : tokens.map((token, index) => {
              const logprob = logprobs[index];
              const title = [
                `token ${index}`,
                logprob === undefined ? null : `logprob ${logprob.toFixed(3)} (p ${Math.exp(logprob).toFixed(3)})`,
                kl && kl[index] !== undefined ? `KL ${kl[index].toFixed(4)}` : null,
              ]
                .filter(Boolean)
                .join(" · ");
              const after = divergence !== null && index >= divergence;
              return (
                <span key={index}>
                  {index === divergence && (
                    <span className="divergence-mark" data-testid="divergence-mark" title={`First divergence: token ${index}`}>
                      ▍
                    </span>
                  )}
                  <span className={after ? "tok tok-after" : "tok"} style={{ background: tokenShade(logprob) }} title={title}>
                    {token}
                  </span>
                </span>
              );
            })}
        {divergence !== null && divergence >= tokens.length && tokens.length > 0 && (
          <span className="divergence-mark" data-testid="divergence-mark" title={`First divergence: token ${divergence} (this side ended)`}>
            ▍
          </span>
        )}
      </p>
    </div>
  );
}
