// One item side by side: an offline run's sample or a shadow pair (sideBySide.ts maps both to one shape).
// The word diff of the two outputs, each side's tokens (shaded by how likely that side found them, where
// logprobs were recorded) with the first divergence marked, the metrics the item has, and its review mark.
import type { SampleMark } from "../../api/types";
import { StatusBadge } from "../../components/StatusBadge";
import { formatDateTime } from "../../format";
import { MARKS, flipLabel, formatFixed, formatMs, klModeLabel, tokenShade, wordDiff } from "./review";
import type { SideBySideItem, SideView } from "./sideBySide";

interface Props {
  item: SideBySideItem;
  canReview: boolean;
  comment: string;
  onComment: (comment: string) => void;
  onMark: (mark: SampleMark) => void;
  onClear: () => void;
  saving: boolean;
  error: string | null;
}

export function SampleSideBySide({ item, canReview, comment, onComment, onMark, onClear, saving, error }: Props) {
  const s = item;
  const divergence = s.firstDivergence;
  const { primary: primaryLabel, candidate: candidateLabel } = s.labels;
  const lower = (label: string) => label.toLowerCase();
  const shaded = s.primary.logprobs.length > 0 || s.candidate.logprobs.length > 0;
  const sequences = s.unit === "token" ? "token sequences" : "texts";
  return (
    <div className="sample-view" data-testid="sample-view" data-sample={s.id}>
      <div className="sample-head">
        <div>
          <strong data-testid="sample-case">{s.title}</strong> <span className="muted">{s.subtitle}</span>{" "}
          {s.tags.map((tag) => (
            <span key={tag} className="tag">
              {tag}
            </span>
          ))}
        </div>
        <div className="sample-badges">
          {s.error ? (
            <StatusBadge status="error" label="request failed" />
          ) : s.candidateError ? (
            <StatusBadge status="error" label={`${lower(candidateLabel)} failed`} />
          ) : s.exactMatch ? (
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
            Expected <code>{s.expected.text}</code> ({s.expected.rule})
          </div>
        )}
      </div>

      {s.error ? (
        <div className="notice notice-bad">{s.error}</div>
      ) : (
        <>
          {s.candidateError && (
            <div className="notice notice-bad" data-testid="candidate-error">
              {candidateLabel} failed: {s.candidateError}
            </div>
          )}
          {!s.candidateError && (
            <div className="sample-diff" data-testid="word-diff">
              <div className="muted sample-label">
                Word diff, {lower(primaryLabel)} → {lower(candidateLabel)}: <del className="diff-del">only in the {lower(primaryLabel)}</del>{" "}
                <ins className="diff-ins">only in the {lower(candidateLabel)}</ins>
              </div>
              <p className="sample-text" data-testid="word-diff-text">
                {wordDiff(s.primary.output, s.candidate.output).map((part, index) =>
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
          )}
          <div className="grid-2 sample-sides">
            <Side title={primaryLabel} testId="reference-tokens" side={s.primary} divergence={divergence} unit={s.unit} />
            <Side title={candidateLabel} testId="candidate-tokens" side={s.candidate} divergence={divergence} unit={s.unit} />
          </div>
          <p className="muted sample-legend">
            {shaded ? "Shading: the darker a token, the less likely its own side found it (1 − p). " : s.unit === "word" ? "No token probabilities for live traffic: nothing is shaded. " : ""}
            {s.candidateError ? null : divergence === null ? (
              `The two ${sequences} are equal.`
            ) : (
              <>
                <span className="divergence-mark">▍</span> marks where they part: {s.unit} {divergence}; the {s.unit}s after it are underlined.
              </>
            )}
          </p>
          <dl className="props sample-metrics" data-testid="sample-metrics">
            <dt>First divergence</dt>
            <dd>
              {divergence ?? "none"}
              {divergence !== null && s.unit === "word" && <span className="muted"> (word)</span>}
            </dd>
            {s.tokenAgreement !== undefined && (
              <>
                <dt>{s.unit === "word" ? "Word agreement" : "Token agreement"}</dt>
                <dd>{formatFixed(s.tokenAgreement)}</dd>
              </>
            )}
            <dt>chrF</dt>
            <dd>{formatFixed(s.chrf, 1)}</dd>
            {s.kl && (
              <>
                <dt>Mean KL</dt>
                <dd>
                  {formatFixed(s.kl.mean, 4)} nats {s.kl.mode && <span className="muted">({klModeLabel(s.kl.mode)}; max {formatFixed(s.kl.max, 4)})</span>}
                </dd>
              </>
            )}
            {s.top1Agreement !== undefined && (
              <>
                <dt>Top-1 agreement</dt>
                <dd>{formatFixed(s.top1Agreement)}</dd>
              </>
            )}
            <dt>Latency</dt>
            <dd title={`${lower(primaryLabel)} → ${lower(candidateLabel)}`} data-testid="sample-latency">
              {formatMs(s.primary.latencyMs)} → {formatMs(s.candidate.latencyMs)}
              {s.primary.ttftMs !== undefined && (
                <>
                  {" "}
                  <span className="muted">
                    (TTFT {formatMs(s.primary.ttftMs)} → {formatMs(s.candidate.ttftMs)})
                  </span>
                </>
              )}
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
                by {s.review.markedBy}, {formatDateTime(s.review.markedAt)}
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
  side: SideView;
  divergence: number | null;
  unit: "token" | "word";
}

function Side({ title, testId, side, divergence, unit }: SideProps) {
  const { tokens, logprobs, kl, correct, output } = side;
  return (
    <div className="sample-side">
      <div className="sample-label">
        <strong>{title}</strong>{" "}
        {correct !== null && <StatusBadge status={correct ? "right" : "wrong"} tone={correct ? "ok" : "bad"} />}
      </div>
      <p className="sample-text tokens" data-testid={testId}>
        {tokens.length === 0
          ? output
          : tokens.map((token, index) => {
              const logprob = logprobs[index];
              const title = [
                `${unit} ${index}`,
                logprob === undefined ? null : `logprob ${logprob.toFixed(3)} (p ${Math.exp(logprob).toFixed(3)})`,
                kl && kl[index] !== undefined ? `KL ${kl[index].toFixed(4)}` : null,
              ]
                .filter(Boolean)
                .join(" · ");
              const after = divergence !== null && index >= divergence;
              return (
                <span key={index}>
                  {index === divergence && (
                    <span className="divergence-mark" data-testid="divergence-mark" title={`First divergence: ${unit} ${index}`}>
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
          <span className="divergence-mark" data-testid="divergence-mark" title={`First divergence: ${unit} ${divergence} (this side ended)`}>
            ▍
          </span>
        )}
      </p>
    </div>
  );
}
