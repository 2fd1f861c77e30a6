import { useCallback, useEffect, useMemo, useState } from "react";
import { Link, useNavigate } from "react-router-dom";
import { api, errorMessage } from "../../api/client";
import type { Page as ApiPage, EvalRun, EvalRunProgress, EvalRunState } from "../../api/types";
import { useAuth } from "../../auth";
import { SelectField } from "../../components/Field";
import { ErrorState, Page } from "../../components/Page";
import { StatusBadge, type BadgeTone } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatPct, formatShortDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useLive, type LiveEvent } from "../../hooks/useLive";
import { useQueryParams } from "../../hooks/useQueryParams";
import { EvaluationsNav } from "./EvaluationsNav";
import { NewRunDialog } from "./NewRunDialog";
import "./evaluations.css";

const LIMIT = 25;
// Live events move the progress bars; a slow refresh as well catches a run that ended before we subscribed.
const REFRESH_MS = 10_000;

const STATE_TONES: Record<EvalRunState, BadgeTone> = {
  pending: "warn",
  running: "info",
  completed: "ok",
  failed: "bad",
  cancelled: "off",
};
const STATES: EvalRunState[] = ["pending", "running", "completed", "failed", "cancelled"];

type Progress = Pick<EvalRunProgress, "state" | "done" | "errors" | "total">;

function isActive(state: EvalRunState): boolean {
  return state === "pending" || state === "running";
}

function isProgress(event: LiveEvent): event is LiveEvent & EvalRunProgress {
  return event.type === "eval_run.progress" && typeof event.run === "number";
}

/** Evaluation runs: each compares a candidate with a reference on a suite version. Running ones move live. */
export function RunsPage() {
  const { canEvaluate } = useAuth();
  const navigate = useNavigate();
  const { get, set: setParam } = useQueryParams();
  const offset = Number(get("offset")) || 0;
  const state = get("state");
  const runs = useApi<ApiPage<EvalRun>>("/api/eval-runs/", { limit: LIMIT, offset, state });
  const [live, setLive] = useState<Record<number, Progress>>({});
  const [cancelError, setCancelError] = useState<string | null>(null);
  const rows = runs.data?.results;
  const reload = runs.reload;

  // A fresh list replaces what the live events said.
  useEffect(() => setLive({}), [runs.data]);

  const active = useMemo(() => (rows ?? []).filter((r) => isActive(r.state)), [rows]);
  const feed = useLive(
    active.map((r) => r.live_group),
    useCallback(
      (event: LiveEvent) => {
        if (!isProgress(event)) return;
        setLive((current) => ({ ...current, [event.run]: { state: event.state, done: event.done, errors: event.errors, total: event.total } }));
        if (event.summary || !isActive(event.state)) reload(); // it ended: fetch its summary
      },
      [reload],
    ),
  );
  useEffect(() => {
    if (!active.length) return;
    const timer = setInterval(reload, REFRESH_MS);
    return () => clearInterval(timer);
  }, [active.length, reload]);

  const cancel = async (run: EvalRun) => {
    setCancelError(null);
    try {
      await api.post<EvalRun>(`/api/eval-runs/${run.id}/cancel/`);
      reload();
    } catch (err) {
      setCancelError(errorMessage(err));
    }
  };

  const creating = get("new") === "1";
  const suiteVersion = Number(get("suite_version")) || undefined;
  const setCreating = (open: boolean) => {
    setParam("suite_version", "");
    setParam("new", open ? "1" : "");
  };

  return (
    <Page
      title="Evaluations"
      subtitle={
        <>
          Runs: a candidate compared with its reference, case by case.{" "}
          <span className="muted" data-testid="runs-live" data-connected={feed.connected ? "true" : "false"}>
            {active.length ? (feed.connected ? "· progress live" : "· not live: refreshing every 10 s") : ""}
          </span>
        </>
      }
      actions={
        canEvaluate && (
          <button type="button" className="btn btn-primary" onClick={() => setCreating(true)}>
            New run
          </button>
        )
      }
    >
      <EvaluationsNav />
      <div className="filters">
        <SelectField
          label="State"
          name="state"
          value={state}
          onChange={(e) => setParam("state", e.target.value)}
          options={[{ value: "", label: "Any" }, ...STATES.map((s) => ({ value: s, label: s }))]}
        />
      </div>
      <ErrorState error={runs.error} onRetry={reload} />
      {cancelError && (
        <div className="notice notice-bad" role="alert">
          {cancelError}
        </div>
      )}
      <Table
        testId="runs-table"
        rows={rows}
        loading={runs.loading}
        rowKey={(r) => r.id}
        onRowClick={(r) => navigate(`/evaluations/runs/${r.id}`)}
        empty={state ? "No run in this state." : "No runs yet."}
        columns={[
          {
            header: "Run",
            wrap: true,
            cell: (r) => (
              <span onClick={(e) => e.stopPropagation()}>
                <Link to={`/evaluations/runs/${r.id}`} data-testid={`run-link-${r.id}`}>
                  <strong>{r.name || `Run #${r.id}`}</strong>
                </Link>
                <div>
                  <Link to={`/evaluations/suites/${r.suite}?version=${r.suite_version}`} className="muted nowrap">
                    {r.suite_name} v{r.suite_version_number}
                  </Link>
                </div>
              </span>
            ),
          },
          {
            header: "Candidate vs reference",
            wrap: true,
            cell: (r) => (
              <span className="run-sides">
                <strong title="candidate">{r.candidate_label}</strong>
                <div className="muted" title="reference">
                  vs {r.reference_label}
                </div>
              </span>
            ),
          },
          {
            header: "State",
            cell: (r) => {
              const s = live[r.id]?.state ?? r.state;
              return (
                <>
                  <StatusBadge status={s} tone={STATE_TONES[s]} />
                  {r.cancel_requested && isActive(s) && <div className="muted">cancelling…</div>}
                </>
              );
            },
          },
          { header: "Progress", cell: (r) => <RunProgress run={r} live={live[r.id]} /> },
          { header: "Accuracy · flips", cell: (r) => <RunFigures run={r} /> },
          {
            header: "Created",
            cell: (r) => (
              <span className="nowrap">
                {formatShortDateTime(r.created_at)}
                <div className="muted">{r.created_by_name ?? "—"}</div>
              </span>
            ),
          },
          {
            header: "",
            className: "actions-cell",
            cell: (r) =>
              canEvaluate &&
              isActive(live[r.id]?.state ?? r.state) &&
              !r.cancel_requested && (
                <button
                  type="button"
                  className="btn btn-small btn-danger"
                  onClick={(e) => {
                    e.stopPropagation();
                    void cancel(r);
                  }}
                >
                  Cancel
                </button>
              ),
          },
        ]}
        pagination={
          runs.data && runs.data.count > LIMIT ? (
            <Pagination count={runs.data.count} limit={LIMIT} offset={offset} onOffset={(o) => setParam("offset", String(o))} />
          ) : undefined
        }
      />
      {canEvaluate && (
        <NewRunDialog
          open={creating}
          suiteVersion={suiteVersion}
          onClose={() => setCreating(false)}
          onCreated={() => {
            setCreating(false);
            reload();
          }}
        />
      )}
    </Page>
  );
}

/** Samples stored of the run's cases, as a bar; the live events' figures while it runs. */
function RunProgress({ run, live }: { run: EvalRun; live?: Progress }) {
  const done = live?.done ?? run.done_count;
  const total = live?.total ?? run.case_count;
  const errors = live?.errors ?? run.error_count;
  const pct = total ? Math.min(100, (done / total) * 100) : 0;
  return (
    <span className="progress" data-testid={`run-progress-${run.id}`} data-done={done} data-total={total} role="progressbar" aria-valuemin={0} aria-valuemax={total} aria-valuenow={done}>
      <span className="progress-bar">
        <span style={{ width: `${pct}%` }} />
      </span>
      <span className="progress-figures">
        {done}/{total}
        {errors > 0 && <span className="progress-failed"> · {errors} failed</span>}
      </span>
    </span>
  );
}

/** A finished run's headline: each side's accuracy and the flips between them, or the exact-match rate. */
function RunFigures({ run }: { run: EvalRun }) {
  const summary = run.summary;
  if (!summary || summary.samples === undefined) return <span className="muted">{run.error ? run.error : "—"}</span>;
  const flips = summary.flips;
  return (
    <span className="run-figures" data-testid={`run-figures-${run.id}`}>
      {flips ? (
        <>
          <span title="accuracy of the reference, then of the candidate">
            ref {formatPct(flips.reference_accuracy)} → cand {formatPct(flips.candidate_accuracy)}
          </span>
          <div>
            <span className="flip-bad" title="right → wrong">
              {flips.right_to_wrong} ↓
            </span>{" "}
            <span className="flip-good" title="wrong → right">
              {flips.wrong_to_right} ↑
            </span>{" "}
            <span className="muted">flips of {flips.n}</span>
          </div>
        </>
      ) : (
        <span className="muted">no expected answers</span>
      )}
      <div className="muted">same output {formatPct(summary.exact_match_rate)}</div>
    </span>
  );
}
