import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { Link, useParams } from "react-router-dom";
import { api, ApiError, errorMessage } from "../../api/client";
import type { EvalRun, EvalRunProgress, EvalSample, EvalSamplePage, EvalSideInfo, EvalVerdict, SampleMark, VerdictDecision } from "../../api/types";
import { useAuth } from "../../auth";
import { SelectField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useLive } from "../../hooks/useLive";
import { useQueryParams } from "../../hooks/useQueryParams";
import "./review.css";
import {
  DECISION_LABEL,
  FINISHED,
  MARKS,
  flipLabel,
  formatFixed,
  formatMs,
  formatPoints,
  formatRate,
  klModeLabel,
} from "./review";
import { SampleSideBySide } from "./SampleSideBySide";
import { sampleItem } from "./sideBySide";
import { usePagedReview } from "./usePagedReview";
import { useReviewKeys } from "./useReviewKeys";

const PAGE_SIZE = 25;
const FILTERS = ["differs", "flipped", "tag", "marked", "errors", "order"] as const;
// While a run is running its sample list is refetched at most this often (progress events come 4 a second).
const SAMPLES_REFRESH_MS = 2000;

type Progress = Pick<EvalRunProgress, "state" | "done" | "errors" | "total">;

/** One evaluation run: summary, verdict bar, live progress, the sample list and a sample side by side. */
export function EvalRunPage() {
  const { id } = useParams();
  const { canEvaluate } = useAuth();
  const run = useApi<EvalRun>(`/api/eval-runs/${id}/`);
  const query = useQueryParams();
  const filters = useMemo(() => Object.fromEntries(FILTERS.map((name) => [name, query.get(name)])), [query]);
  const offset = Number(query.get("offset") || 0);
  const samples = useApi<EvalSamplePage>(`/api/eval-runs/${id}/samples/`, { ...filters, limit: PAGE_SIZE, offset });
  const [progress, setProgress] = useState<Progress | null>(null);
  const reloadRun = run.reload;
  const reloadSamples = samples.reload;
  const lastSamplesReload = useRef(0);

  const live = useLive(run.data ? [run.data.live_group] : [], (event) => {
    if (event.type === "eval_run.progress") {
      const { state, done, errors, total } = event as unknown as EvalRunProgress;
      const next = { state, done, errors, total };
      setProgress(next);
      const now = Date.now();
      if (FINISHED.has(next.state)) {
        reloadRun();
        reloadSamples();
      } else if (now - lastSamplesReload.current > SAMPLES_REFRESH_MS) {
        lastSamplesReload.current = now;
        reloadSamples();
      }
    } else if (event.type === "eval_run.verdict") {
      reloadRun();
    }
  });

  // Without the live feed (Redis down, a proxy without WebSockets) an unfinished run is polled instead.
  const unfinished = run.data !== undefined && !FINISHED.has(run.data.state);
  useEffect(() => {
    if (!unfinished || live.connected) return;
    const timer = setInterval(() => {
      reloadRun();
      reloadSamples();
    }, 3000);
    return () => clearInterval(timer);
  }, [unfinished, live.connected, reloadRun, reloadSamples]);

  if (run.error) {
    return (
      <Page title="Evaluation run" subtitle={<Link to="/evaluations">← Evaluations</Link>}>
        <ErrorState error={run.error} onRetry={run.reload} />
      </Page>
    );
  }
  if (!run.data) return <Page title="Evaluation run">Loading…</Page>;
  const r = run.data;
  const exportQuery = new URLSearchParams(Object.entries(filters).filter(([, value]) => value)).toString();
  const filtered = exportQuery !== "" && exportQuery !== "order=position";

  return (
    <Page
      title={
        <>
          {r.name || `Run ${r.id}`} <StatusBadge status={r.state} tone={r.state === "completed" ? "ok" : undefined} />
        </>
      }
      subtitle={
        <>
          <Link to="/evaluations">← Evaluations</Link> · {r.suite_name} v{r.suite_version_number} · {r.case_count} cases · created {formatDateTime(r.created_at)}{" "}
          <span className={live.connected ? "live live-on" : "live"} data-testid="run-live" data-connected={live.connected ? "true" : "false"}>
            {live.connected ? "live" : "not live"}
          </span>
        </>
      }
      actions={
        <>
          <a className="btn" href={`/api/eval-runs/${r.id}/export/csv/${exportQuery ? `?${exportQuery}` : ""}`} download data-testid="export-csv">
            Export CSV{filtered ? " (filtered)" : ""}
          </a>
          <a className="btn" href={`/api/eval-runs/${r.id}/export/jsonl/${exportQuery ? `?${exportQuery}` : ""}`} download data-testid="export-jsonl">
            Export JSONL{filtered ? " (filtered)" : ""}
          </a>
        </>
      }
    >
      <VerdictBar run={r} canSign={canEvaluate} onSigned={run.reload} />
      {!FINISHED.has(r.state) && <ProgressCard run={r} progress={progress} />}
      {r.error && (
        <div className="notice notice-bad" role="alert">
          {r.error}
        </div>
      )}
      <SummaryCard run={r} />
      <SamplesCard
        run={r}
        samples={samples.data}
        loading={samples.loading}
        error={samples.error}
        onRetry={samples.reload}
        offset={offset}
        query={query}
        canReview={canEvaluate}
        onMarked={run.reload}
      />
    </Page>
  );
}

// -- verdict ------------------------------------------------------------------------------------------------

function VerdictBar({ run, canSign, onSigned }: { run: EvalRun; canSign: boolean; onSigned: () => void }) {
  const [comment, setComment] = useState("");
  const [error, setError] = useState<ApiError | Error | null>(null);
  const [busy, setBusy] = useState(false);
  const [showHistory, setShowHistory] = useState(false);
  const verdict = run.verdict;
  const finished = FINISHED.has(run.state);
  const tooFew = run.scored_count < run.min_scored_to_accept;
  const acceptBlocked =
    run.state !== "completed" && finished
      ? "Only a completed run can be accepted"
      : finished && tooFew
        ? `Accepting needs at least ${run.min_scored_to_accept} scored samples; this run scored ${run.scored_count}`
        : undefined;

  const sign = async (decision: VerdictDecision) => {
    setBusy(true);
    setError(null);
    try {
      await api.post<EvalVerdict>(`/api/eval-runs/${run.id}/sign/`, { decision, comment });
      setComment("");
      onSigned();
    } catch (err) {
      setError(err instanceof Error ? err : new Error(String(err)));
    } finally {
      setBusy(false);
    }
  };
  const commentErrors = error instanceof ApiError ? error.fieldErrors["comment"] : undefined;
  const otherErrors = error instanceof ApiError ? error.generalErrors : error ? [error.message] : [];

  return (
    <div className={`verdict-bar verdict-${verdict?.decision ?? "none"}`} data-testid="verdict-bar">
      <div className="verdict-current">
        <span className="muted">Verdict</span>{" "}
        {verdict ? (
          <span data-testid="verdict-current" data-decision={verdict.decision}>
            <StatusBadge status={verdict.decision} tone={verdict.decision === "accept" ? "ok" : "bad"} label={DECISION_LABEL[verdict.decision]} />{" "}
            by <strong>{verdict.signed_by_name}</strong>, {formatDateTime(verdict.signed_at)}
            {verdict.comment && <span className="verdict-comment">“{verdict.comment}”</span>}
          </span>
        ) : (
          <span className="muted" data-testid="verdict-current" data-decision="">
            not signed off yet
          </span>
        )}
        {finished && (
          <span className="muted verdict-counts" data-testid="verdict-counts">
            {run.scored_count} scored · <span className={run.error_count ? "text-bad" : undefined}>{run.error_count} failed</span> of {run.case_count}
          </span>
        )}
        {verdict && (
          <button type="button" className="btn btn-small" onClick={() => setShowHistory(!showHistory)}>
            {showHistory ? "Hide history" : "History"}
          </button>
        )}
      </div>
      {canSign && (
        <div className="verdict-sign">
          <input
            aria-label="Verdict comment"
            name="verdict_comment"
            value={comment}
            onChange={(e) => setComment(e.target.value)}
            placeholder={finished ? "Comment (required to reject)" : "Sign-off opens when the run has finished"}
            disabled={!finished || busy}
            aria-invalid={Boolean(commentErrors)}
          />
          <button
            type="button"
            className="btn btn-primary"
            disabled={!finished || busy || acceptBlocked !== undefined}
            title={acceptBlocked}
            onClick={() => void sign("accept")}
          >
            Accept run
          </button>
          <button type="button" className="btn btn-danger" disabled={!finished || busy} onClick={() => void sign("reject")}>
            Reject run
          </button>
        </div>
      )}
      {(commentErrors || otherErrors.length > 0) && (
        <div className="form-error verdict-error" role="alert">
          {[...(commentErrors ?? []), ...otherErrors].join(" ")}
        </div>
      )}
      {showHistory && <VerdictHistory key={verdict?.id} runId={run.id} />}
    </div>
  );
}

/** Every verdict of the run; remounted (so refetched) when a new one is signed. */
function VerdictHistory({ runId }: { runId: number }) {
  const history = useApi<EvalVerdict[]>(`/api/eval-runs/${runId}/verdicts/`);
  return (
    <div className="verdict-history" data-testid="verdict-history">
      <ErrorState error={history.error} onRetry={history.reload} />
      <Table
        rows={history.data}
        loading={history.loading}
        rowKey={(v) => v.id}
        empty="No verdicts."
        columns={[
          { header: "Decision", cell: (v) => <StatusBadge status={v.decision} tone={v.decision === "accept" ? "ok" : "bad"} label={DECISION_LABEL[v.decision]} /> },
          { header: "Signed by", cell: (v) => v.signed_by_name },
          { header: "When", cell: (v) => formatDateTime(v.signed_at) },
          { header: "Comment", className: "wrap", cell: (v) => v.comment || <span className="muted">—</span> },
          { header: "", cell: (v) => (v.current ? "current" : <span className="muted">superseded {formatDateTime(v.superseded_at)}</span>) },
        ]}
      />
    </div>
  );
}

// -- progress and summary --------------------------------------------------------------------------------

function ProgressCard({ run, progress }: { run: EvalRun; progress: Progress | null }) {
  const done = progress?.done ?? run.done_count;
  const total = progress?.total ?? run.case_count;
  const errors = progress?.errors ?? run.error_count;
  const pct = total ? Math.min(100, (done / total) * 100) : 0;
  return (
    <Card title="Progress" testId="run-progress">
      <div className="progress" role="progressbar" aria-valuemin={0} aria-valuemax={total} aria-valuenow={done}>
        <div className="progress-bar" style={{ width: `${pct}%` }} />
      </div>
      <p className="muted" style={{ marginBottom: 0 }}>
        <span data-testid="progress-text">
          {done} of {total} cases
        </span>
        {errors > 0 && ` · ${errors} failed`} · {progress?.state ?? run.state}
        {run.cancel_requested && " · cancelling"}
      </p>
    </Card>
  );
}

function sideLabel(info: EvalSideInfo, model: string): string {
  if (info.model && info.revision) return `${info.model}@${info.revision}`;
  return model;
}

function SummaryCard({ run }: { run: EvalRun }) {
  const s = run.summary;
  const flips = s.flips ?? null;
  const modes = Object.entries(s.distributions ?? {});
  const ci = flips?.difference_ci;
  return (
    <Card title="Summary" testId="run-summary">
      {run.teacher_forcing_note && (
        <div className="notice notice-warn" data-testid="teacher-forcing-note">
          <strong>No teacher forcing.</strong> {run.teacher_forcing_note}. The KL below is the free-running top-k comparison, not the candidate scoring the reference&apos;s text.
        </div>
      )}
      <div className="grid-2">
        <dl className="props">
          <dt>Reference</dt>
          <dd>
            <SideName info={run.reference_info} model={run.reference_model} />
          </dd>
          <dt>Candidate</dt>
          <dd>
            <SideName info={run.candidate_info} model={run.candidate_model} />
          </dd>
          <dt>Sampling</dt>
          <dd data-testid="sampling">
            greedy, seed {run.seed}, max {run.max_tokens} tokens, top-{run.top_logprobs} logprobs
            {(["reference", "candidate"] as const).map((side) => (
              <div key={side} className="muted" data-testid={`greedy-${side}`}>
                {side}: {Object.entries(run.sampling.greedy[side]).map(([name, value]) => `${name} ${String(value)}`).join(" · ")}
              </div>
            ))}
          </dd>
          <dt>Samples</dt>
          <dd>
            {s.samples ?? run.done_count} scored{s.errors ? ` · ${s.errors} failed` : ""}
          </dd>
          <dt>Review</dt>
          <dd data-testid="mark-counts">
            {MARKS.map((m) => `${run.marks[m.value]} ${m.label.toLowerCase()}`).join(" · ")} · {run.marks.unmarked} unmarked
          </dd>
        </dl>
        <dl className="props" data-testid="summary-figures">
          <dt>Accuracy</dt>
          <dd>
            {flips ? (
              <>
                {formatRate(flips.reference_accuracy)} → {formatRate(flips.candidate_accuracy)}{" "}
                <span className="muted">(reference → candidate, over {flips.n} cases with an expected answer)</span>
              </>
            ) : (
              <span className="muted">no expected answers</span>
            )}
          </dd>
          <dt>Flips</dt>
          <dd data-testid="summary-flips">
            {flips ? (
              <>
                {flips.right_to_wrong} right → wrong · {flips.wrong_to_right} wrong → right
                <div className="muted">
                  difference {formatPoints(flips.accuracy_difference)}
                  {ci && ` (${Math.round(flips.confidence * 100)}% CI ${formatPoints(ci[0])} to ${formatPoints(ci[1])})`}
                </div>
                <div className="muted" data-testid="summary-mcnemar">
                  McNemar exact p = {formatFixed(flips.mcnemar_p, 3)}
                  {flips.recovery != null && ` · recovery ${formatFixed(flips.recovery, 1)} %`}
                </div>
              </>
            ) : (
              "—"
            )}
          </dd>
          <dt>Exact match</dt>
          <dd>{formatRate(s.exact_match_rate)}</dd>
          <dt>Mean KL</dt>
          <dd data-testid="summary-kl">
            {modes.length === 0
              ? "—"
              : modes.map(([mode, d]) => (
                  <div key={mode}>
                    {formatFixed(d.mean_kl, 4)} nats
                    {d.kl_ci && <span className="muted"> (95% CI {formatFixed(d.kl_ci[0], 4)} to {formatFixed(d.kl_ci[1], 4)})</span>}{" "}
                    <span className="muted">({klModeLabel(mode)}; same top token {formatRate(d.top1_agreement)}, {d.positions} positions)</span>
                    <div className="muted" data-testid={`kl-method-${mode}`}>{klMethodLabel(d)}</div>
                    {d.kl_quantiles && (
                      <div className="muted" data-testid={`kl-quantiles-${mode}`}>
                        p90 {formatFixed(d.kl_quantiles.p90, 4)} · p99 {formatFixed(d.kl_quantiles.p99, 4)} · p99.9 {formatFixed(d.kl_quantiles.p99_9, 4)} · max {formatFixed(d.kl_quantiles.max, 4)}
                      </div>
                    )}
                    {d.dp_positions ? (
                      <div className="muted" data-testid={`kl-dp-${mode}`}>
                        Δp of the reference token: mean {formatFixed(d.mean_dp, 4)}, RMS {formatFixed(d.rms_dp, 4)} · perplexity ratio {formatFixed(d.perplexity_ratio, 4)}
                      </div>
                    ) : null}
                  </div>
                ))}
          </dd>
          <dt>chrF</dt>
          <dd>
            {formatFixed(s.chrf, 1)}
            {s.chrf_ci && <span className="muted"> (95% CI {formatFixed(s.chrf_ci[0], 1)} to {formatFixed(s.chrf_ci[1], 1)})</span>}{" "}
            <span className="muted">· token agreement {formatFixed(s.token_agreement)} · length difference {formatFixed(s.length_difference, 1)}</span>
          </dd>
        </dl>
      </div>
      <TimingTable run={run} />
      <TagTable run={run} />
    </Card>
  );
}

type DistributionSummary = NonNullable<EvalRun["summary"]["distributions"]>[string];

/** Whether the KL saw whole distributions (exact) or top-k listings, and how much mass those left out. */
function klMethodLabel(d: DistributionSummary): string {
  if (d.method === "full_vocabulary") return "exact: both sides listed the whole vocabulary";
  if (d.method !== "top_k") return "";
  const k = d.k == null ? "" : ` (k = ${d.k})`;
  const tail = d.tail_mass_max == null ? "" : `; listings left out up to ${formatRate(d.tail_mass_max)} of the probability at a position`;
  return `top-k approximation${k}${tail}`;
}

function TagTable({ run }: { run: EvalRun }) {
  const tags = Object.entries(run.summary.by_tag ?? {});
  if (tags.length === 0) return null;
  return (
    <Table
      testId="tag-table"
      rows={tags}
      rowKey={([tag]) => tag}
      columns={[
        { header: "Tag", cell: ([tag]) => <code>{tag}</code> },
        { header: "Samples", className: "num", cell: ([, t]) => t.samples },
        { header: "Exact", className: "num", cell: ([, t]) => formatRate(t.exact_match_rate) },
        { header: "chrF", className: "num", cell: ([, t]) => formatFixed(t.chrf, 1) },
        { header: "Mean KL", className: "num", cell: ([, t]) => formatFixed(t.mean_kl, 4) },
        { header: "Accuracy", className: "num", cell: ([, t]) => (t.reference_accuracy == null ? "—" : `${formatRate(t.reference_accuracy)} → ${formatRate(t.candidate_accuracy)}`) },
        { header: "Flips", className: "num", cell: ([, t]) => t.flips ?? "—" },
        { header: "Recovery", className: "num", cell: ([, t]) => (t.recovery == null ? "—" : `${formatFixed(t.recovery, 1)} %`) },
      ]}
    />
  );
}

function SideName({ info, model }: { info: EvalSideInfo; model: string }) {
  const label = sideLabel(info, model);
  return (
    <>
      {info.model_version_id ? <Link to={`/models/versions/${info.model_version_id}`}>{label}</Link> : <code>{label}</code>}
      {info.deployment && <span className="muted"> · {info.deployment}{info.engine ? ` (${info.engine})` : ""}</span>}
    </>
  );
}

function TimingTable({ run }: { run: EvalRun }) {
  const rows = (["reference", "candidate"] as const).map((side) => ({ side, t: run.summary[side] }));
  if (rows.every((row) => !row.t)) return null;
  return (
    <Table
      testId="timing-table"
      rows={rows}
      rowKey={(row) => row.side}
      columns={[
        { header: "Side", cell: (row) => <strong style={{ textTransform: "capitalize" }}>{row.side}</strong> },
        { header: "Latency mean", className: "num", cell: (row) => formatMs(row.t?.latency_ms.mean) },
        { header: "p50", className: "num", cell: (row) => formatMs(row.t?.latency_ms.p50) },
        { header: "p95", className: "num", cell: (row) => formatMs(row.t?.latency_ms.p95) },
        { header: "TTFT mean", className: "num", cell: (row) => formatMs(row.t?.ttft_ms.mean) },
        { header: "TTFT p95", className: "num", cell: (row) => formatMs(row.t?.ttft_ms.p95) },
        { header: "Tokens/s mean", className: "num", cell: (row) => formatFixed(row.t?.tokens_per_s.mean, 1) },
      ]}
    />
  );
}

// -- samples ----------------------------------------------------------------------------------------------

interface SamplesCardProps {
  run: EvalRun;
  samples: EvalSamplePage | undefined;
  loading: boolean;
  error: unknown;
  onRetry: () => void;
  offset: number;
  query: ReturnType<typeof useQueryParams>;
  canReview: boolean;
  onMarked: () => void;
}

function SamplesCard({ run, samples, loading, error, onRetry, offset, query, canReview, onMarked }: SamplesCardProps) {
  const { rows, setSelected, current, count, move, replace } = usePagedReview<EvalSample>(samples, offset, PAGE_SIZE, query);
  const [comment, setComment] = useState("");
  const [saving, setSaving] = useState(false);
  const [markError, setMarkError] = useState<string | null>(null);
  const currentId = current?.id;
  const currentComment = current?.review?.comment ?? "";
  useEffect(() => {
    setComment(currentComment);
    setMarkError(null);
  }, [currentId, currentComment]);

  const save = useCallback(
    async (sample: EvalSample, mark: SampleMark | null) => {
      setSaving(true);
      setMarkError(null);
      const url = `/api/eval-runs/${run.id}/samples/${sample.id}/mark/`;
      try {
        // Both answer the sample with its review (null once cleared).
        const answer = mark === null ? await api.delete<EvalSample>(url) : await api.post<EvalSample>(url, { mark, comment });
        replace(answer);
        onMarked();
      } catch (err) {
        setMarkError(errorMessage(err));
      } finally {
        setSaving(false);
      }
    },
    [run.id, comment, onMarked, replace],
  );

  useReviewKeys({
    move,
    mark: (mark) => current && void save(current, mark),
    canMark: canReview && !!current && !current.error && !saving,
  });

  const filter = (name: string) => query.get(name);
  // Tags offered: those of the rows shown, and the one filtered on.
  const tags = new Set<string>(rows.flatMap((s) => s.tags));
  if (filter("tag")) tags.add(filter("tag"));
  const tagOptions = [{ value: "", label: "Any tag" }, ...[...tags].sort().map((tag) => ({ value: tag, label: tag }))];

  return (
    <Card title={`Samples (${count})`} testId="samples-card">
      <div className="filters" data-testid="sample-filters">
        <SelectField
          label="Outputs"
          name="differs"
          value={filter("differs")}
          onChange={(e) => query.set("differs", e.target.value)}
          options={[
            { value: "", label: "All" },
            { value: "true", label: "Differ" },
            { value: "false", label: "Identical" },
          ]}
        />
        <SelectField
          label="Flipped"
          name="flipped"
          value={filter("flipped")}
          onChange={(e) => query.set("flipped", e.target.value)}
          options={[
            { value: "", label: "Any" },
            { value: "any", label: "Flipped (either way)" },
            { value: "right_to_wrong", label: "Right → wrong" },
            { value: "wrong_to_right", label: "Wrong → right" },
          ]}
        />
        <SelectField label="Tag" name="tag" value={filter("tag")} onChange={(e) => query.set("tag", e.target.value)} options={tagOptions} />
        <SelectField
          label="Mark"
          name="marked"
          value={filter("marked")}
          onChange={(e) => query.set("marked", e.target.value)}
          options={[
            { value: "", label: "Any" },
            { value: "none", label: "Not marked" },
            { value: "any", label: "Marked" },
            ...MARKS.map((m) => ({ value: m.value, label: m.label })),
          ]}
        />
        <SelectField
          label="Requests"
          name="errors"
          value={filter("errors")}
          onChange={(e) => query.set("errors", e.target.value)}
          options={[
            { value: "", label: "All" },
            { value: "false", label: "Answered" },
            { value: "true", label: "Failed" },
          ]}
        />
        <SelectField
          label="Order"
          name="order"
          value={filter("order")}
          onChange={(e) => query.set("order", e.target.value)}
          options={[
            { value: "", label: "Suite order" },
            { value: "worst_kl", label: "Worst KL first" },
            { value: "longest_divergence", label: "Longest divergence (earliest parting)" },
            { value: "latest_divergence", label: "Latest divergence first" },
            { value: "lowest_chrf", label: "Lowest chrF first" },
          ]}
        />
      </div>
      <p className="muted keys-help">
        <kbd>j</kbd> / <kbd>k</kbd> next / previous sample{canReview && <> · <kbd>1</kbd> <kbd>2</kbd> <kbd>3</kbd> mark same / acceptable / regression</>}
      </p>
      <ErrorState error={error} onRetry={onRetry} />
      <div className="samples-layout">
        <Table
          testId="samples-table"
          rows={samples ? rows : undefined}
          loading={loading}
          rowKey={(s) => s.id}
          onRowClick={(s) => setSelected(rows.findIndex((row) => row.id === s.id))}
          rowClassName={(s) => (s.id === currentId ? "row-selected" : undefined)}
          empty={run.done_count === 0 ? "No samples yet." : "No sample matches these filters."}
          columns={[
            { header: "#", className: "num", cell: (s) => s.position + 1 },
            { header: "Case", wrap: true, cell: (s) => <strong>{s.case_key}</strong> },
            {
              header: "Parts at",
              className: "num",
              cell: (s) => (s.error ? <StatusBadge status="error" label="failed" /> : s.first_divergence ?? <span className="muted">same</span>),
            },
            { header: "Mean KL", className: "num", cell: (s) => formatFixed(s.mean_kl, 4) },
            { header: "chrF", className: "num", cell: (s) => formatFixed(s.chrf, 1) },
            { header: "Flip", cell: (s) => (s.flip ? <span className={`flip flip-${s.flip}`}>{flipLabel(s.flip)}</span> : "") },
            {
              header: "Mark",
              cell: (s) => (s.review ? <StatusBadge status={s.review.mark} tone={MARKS.find((m) => m.value === s.review?.mark)?.tone} /> : <span className="muted">—</span>),
            },
          ]}
          pagination={count > PAGE_SIZE ? <Pagination count={count} limit={PAGE_SIZE} offset={offset} onOffset={(next) => query.set("offset", String(next))} /> : undefined}
        />
        {current ? (
          <SampleSideBySide
            item={sampleItem(current)}
            canReview={canReview}
            comment={comment}
            onComment={setComment}
            onMark={(mark) => void save(current, mark)}
            onClear={() => void save(current, null)}
            saving={saving}
            error={markError}
          />
        ) : null}
      </div>
    </Card>
  );
}
