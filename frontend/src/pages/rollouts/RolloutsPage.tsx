import { useEffect, useMemo, useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { api, errorMessage } from "../../api/client";
import type {
  AliasServing,
  Page as ApiPage,
  GateSeries,
  ModelAlias,
  ModelVersion,
  Rollout,
  RolloutDetail,
  RolloutStep,
  ShadowConfig,
} from "../../api/types";
import { useAuth } from "../../auth";
import { ConfirmDialog, Dialog } from "../../components/Dialog";
import { CheckboxField, FormErrors, InputField, SelectField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { ServingSplit } from "../../components/Serving";
import { Table } from "../../components/Table";
import { TimeChart } from "../../components/TimeChart";
import { formatDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useFormState } from "../../hooks/useFormState";
import { useQueryParams } from "../../hooks/useQueryParams";
import {
  ACTIVE_STATES,
  GATE_FIELDS,
  LIMIT_FIELDS,
  OUTCOME_TONES,
  STATE_TONES,
  formatShare,
  gateChart,
  latestDetail,
  latestValue,
  metricSummary,
  parseSteps,
} from "./rollouts";
import "./rollouts.css";

/** How often the page re-reads the split, the selected rollout and its gate values (the gate task's pace). */
const REFRESH_MS = 2000;

function useTick(ms: number): number {
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const timer = window.setInterval(() => setTick((n) => n + 1), ms);
    return () => window.clearInterval(timer);
  }, [ms]);
  return tick;
}

/** Canaries per alias: the traffic split now, each rollout's steps with each step's decision and its numbers,
 *  gate values against thresholds and its decision history; admins start, pause, resume, approve, promote
 *  and roll back. Shadow traffic is configured here too. */
export function RolloutsPage() {
  const { isAdmin } = useAuth();
  const tick = useTick(REFRESH_MS);
  const { get, set } = useQueryParams();
  const serving = useApi<AliasServing[]>("/api/routing/serving/", { tick });
  const rollouts = useApi<ApiPage<Rollout>>("/api/rollouts/", { limit: 100, tick });
  const [starting, setStarting] = useState(false);
  const list = rollouts.data?.results ?? [];
  const firstActive = list.find((r) => ACTIVE_STATES.includes(r.state)) ?? list[0];
  const selectedId = get("id") || (firstActive ? String(firstActive.id) : "");

  return (
    <Page
      title="Rollouts"
      subtitle="Canaries raise a candidate version's share step by step while its gates hold, and roll it back when they do not."
      actions={
        isAdmin && (
          <button type="button" className="btn btn-primary" onClick={() => setStarting(true)}>
            Start rollout
          </button>
        )
      }
    >
      <Card title="Traffic split: configured and live" testId="split-card">
        <ErrorState error={serving.error} onRetry={serving.reload} />
        <Table
          testId="split-table"
          rows={serving.data}
          loading={serving.loading && !serving.data}
          rowKey={(a) => a.alias}
          empty="No aliases yet."
          columns={[
            { header: "Alias", cell: (a) => <code>{a.alias_name}</code> },
            { header: "Versions serving", className: "wrap", cell: (a) => <ServingSplit serving={a} routes /> },
            {
              header: "Rollout",
              cell: (a) =>
                a.rollout ? (
                  <button type="button" className="btn btn-small" onClick={() => set("id", String(a.rollout))}>
                    #{a.rollout} <StatusBadge status={a.rollout_state} tone={STATE_TONES[a.rollout_state as keyof typeof STATE_TONES]} />
                  </button>
                ) : (
                  <span className="muted">none</span>
                ),
            },
          ]}
        />
      </Card>
      <Card title="Rollouts" testId="rollouts-card">
        <ErrorState error={rollouts.error} onRetry={rollouts.reload} />
        <Table
          testId="rollouts-table"
          rows={list}
          loading={rollouts.loading && !rollouts.data}
          rowKey={(r) => r.id}
          onRowClick={(r) => set("id", String(r.id))}
          empty="No rollouts yet."
          columns={[
            { header: "#", cell: (r) => (String(r.id) === selectedId ? <strong>#{r.id}</strong> : `#${r.id}`) },
            { header: "Alias", cell: (r) => <code>{r.alias_name}</code> },
            { header: "Candidate", wrap: true, cell: (r) => `${r.baseline_label} → ${r.candidate_label}` },
            { header: "State", cell: (r) => <StatusBadge status={r.state} tone={STATE_TONES[r.state]} /> },
            { header: "Share", cell: (r) => formatShare(r.share) },
            { header: "Started", cell: (r) => formatDateTime(r.created_at) },
          ]}
        />
      </Card>
      {selectedId && (
        <RolloutDetailCard id={selectedId} tick={tick} serving={serving.data} onChanged={rollouts.reload} />
      )}
      <ShadowCard />
      {starting && (
        <StartRolloutDialog
          onClose={() => setStarting(false)}
          onDone={(r) => {
            setStarting(false);
            rollouts.reload();
            set("id", String(r.id));
          }}
        />
      )}
    </Page>
  );
}

function RolloutDetailCard({
  id,
  tick,
  serving,
  onChanged,
}: {
  id: string;
  tick: number;
  serving: AliasServing[] | undefined;
  onChanged: () => void;
}) {
  const { isAdmin } = useAuth();
  const detail = useApi<RolloutDetail>(`/api/rollouts/${id}/`, { tick });
  const gates = useApi<GateSeries>(`/api/rollouts/${id}/gates/`, { tick });
  const [confirm, setConfirm] = useState<"promote" | "rollback" | "approve" | null>(null);
  const [reason, setReason] = useState("");
  const { error, busy, run } = useFormState();
  const r = detail.data;
  if (!r) return <ErrorState error={detail.error} onRetry={detail.reload} />;
  const act = (name: string) =>
    void run(async () => {
      await api.post(`/api/rollouts/${r.id}/${name}/`, reason ? { reason } : {});
      setConfirm(null);
      setReason("");
      detail.reload();
      gates.reload();
      onChanged();
    });
  const active = ACTIVE_STATES.includes(r.state);
  const aliasServing = serving?.find((s) => s.alias === r.alias);
  const windowSeconds = Math.max(600, Math.ceil((Date.now() - Date.parse(r.created_at)) / 1000) + 30);

  return (
    <Card
      title={
        <span>
          Rollout #{r.id}: <code>{r.alias_name}</code> {r.baseline_label} → {r.candidate_label}{" "}
          <StatusBadge status={r.state} tone={STATE_TONES[r.state]} />
        </span>
      }
      testId="rollout-detail"
      actions={
        isAdmin &&
        active && (
          <div className="rollout-actions">
            {r.state === "awaiting_approval" && (
              <button type="button" className="btn btn-primary" disabled={busy} onClick={() => setConfirm("approve")}>
                Approve
              </button>
            )}
            {(r.state === "running" || r.state === "holding") && (
              <button type="button" className="btn" disabled={busy} onClick={() => act("pause")}>
                Pause
              </button>
            )}
            {(r.state === "paused" || r.state === "holding") && (
              <button type="button" className="btn" disabled={busy} onClick={() => act("resume")}>
                Resume
              </button>
            )}
            <button type="button" className="btn btn-primary" disabled={busy} onClick={() => setConfirm("promote")}>
              Promote
            </button>
            <button type="button" className="btn btn-danger" disabled={busy} onClick={() => setConfirm("rollback")}>
              Roll back
            </button>
          </div>
        )
      }
    >
      {!confirm && <FormErrors error={error} />}
      <p className="rollout-reason" data-testid="rollout-reason">
        {r.reason}
      </p>
      <ol className="rollout-steps" data-testid="rollout-steps">
        {r.steps.map((s, i) => (
          <li
            key={s}
            className={i < r.step_index ? "done" : i === r.step_index && active ? "current" : r.state === "promoted" ? "done" : ""}
            data-current={i === r.step_index && active ? "true" : undefined}
          >
            {formatShare(s)}
          </li>
        ))}
      </ol>
      <dl className="kv rollout-facts">
        <dt>Canary share (configured)</dt>
        <dd data-testid="rollout-share">{formatShare(r.share)}</dd>
        {active && (
          <>
            <dt>Serving now</dt>
            <dd>
              {/* The alias's serving answer: the share the rollout sets beside what the request log shows. */}
              {aliasServing ? <ServingSplit serving={aliasServing} routes /> : <span className="muted">…</span>}
            </dd>
          </>
        )}
        <dt>Per step at least</dt>
        <dd>
          {r.min_step_seconds} s and {r.min_step_requests} candidate requests
        </dd>
        <dt>Step started</dt>
        <dd>{formatDateTime(r.step_started_at)}</dd>
        <dt>Sign-off</dt>
        <dd>{r.require_signoff ? "required before promotion" : "not required"}</dd>
        <dt>Approval</dt>
        <dd data-testid="rollout-approval-steps">
          {r.approval_steps.length ? `an admin approves after ${r.approval_steps.map(formatShare).join(", ")}` : "none: the gates decide every step"}
        </dd>
      </dl>
      <h3 className="rollout-h">Steps: each step's decision and its numbers</h3>
      <StepAnalysisTable steps={r.steps_analysis} />
      <h3 className="rollout-h">Gates</h3>
      {gates.data && gates.data.gates.length === 0 && <p className="muted">No gates configured: each step advances once its minimums are met.</p>}
      {gates.data && gates.data.gates.length > 0 && (
        <>
          <Table
            testId="gates-table"
            rows={gates.data.gates}
            rowKey={(g) => g.key}
            columns={[
              { header: "Gate", cell: (g) => g.title },
              { header: "Threshold", cell: (g) => `${g.bound === "max" ? "≤" : "≥"} ${g.threshold}${g.unit === "x" ? "×" : ""}` },
              {
                header: "Latest",
                cell: (g) => {
                  const v = latestValue(gates.data as GateSeries, g.key);
                  return v === null ? <span className="muted">no data</span> : Number(v.toFixed(4));
                },
              },
              {
                header: "Judgement",
                cell: (g) => {
                  const detail = latestDetail(gates.data as GateSeries, g.key);
                  return detail ? <span data-testid={`gate-judgement-${g.key}`}>{detail}</span> : <span className="muted">—</span>;
                },
              },
            ]}
          />
          <div className="gate-charts">
            {gates.data.gates.map((g) => {
              const chart = gateChart(gates.data as GateSeries, g);
              return (
                <TimeChart
                  key={g.key}
                  testId={`gate-chart-${g.key}`}
                  title={g.title}
                  unit={g.unit || "value"}
                  format={(v) => String(Number(v.toFixed(4)))}
                  t={chart.t}
                  windowSeconds={windowSeconds}
                  height={130}
                  series={[
                    { label: "value", values: chart.values },
                    { label: "threshold", values: chart.threshold, color: "#c2372f" },
                  ]}
                />
              );
            })}
          </div>
        </>
      )}
      <h3 className="rollout-h">Decisions</h3>
      <Table
        testId="decisions-table"
        rows={[...r.decisions].reverse()}
        rowKey={(d) => d.id}
        columns={[
          { header: "When", cell: (d) => formatDateTime(d.created_at) },
          { header: "Decision", cell: (d) => <span data-action={d.action}>{d.action}</span> },
          { header: "Share", cell: (d) => `${formatShare(d.from_share)} → ${formatShare(d.to_share)}` },
          { header: "By", cell: (d) => d.actor_name },
          { header: "Why", wrap: true, cell: (d) => <span className="decision-reason">{d.reason}</span> },
        ]}
      />
      <ConfirmDialog
        open={confirm !== null}
        title={
          confirm === "promote"
            ? `Promote ${r.candidate_label}?`
            : confirm === "approve"
              ? `Approve the ${formatShare(r.share)} step?`
              : `Roll back to ${r.baseline_label}?`
        }
        message={
          <>
            <p>
              {confirm === "promote"
                ? `${r.candidate_label} becomes the active version of ${r.alias_name} for every request.`
                : confirm === "approve"
                  ? r.step_index + 1 >= r.steps.length - 1
                    ? `${r.candidate_label} is promoted: it becomes the active version of ${r.alias_name}.`
                    : `The canary goes on to ${formatShare(r.steps[r.step_index + 1] ?? 100)} and the gates judge that step.`
                  : `The candidate's share goes to 0% at once; ${r.baseline_label} serves everything.`}
            </p>
            <InputField label="Reason (optional)" name="reason" value={reason} onChange={(e) => setReason(e.target.value)} />
          </>
        }
        confirmLabel={confirm === "promote" ? "Promote" : confirm === "approve" ? "Approve" : "Roll back"}
        danger={confirm === "rollback"}
        busy={busy}
        error={error ? errorMessage(error) : undefined}
        onConfirm={() => confirm && act(confirm)}
        onClose={() => setConfirm(null)}
      />
    </Card>
  );
}

/** One row per step of the plan: where the rollout is with it, its latest decision, and each gate's outcome
 *  with its value, threshold, counts and limits (dry-run gates marked: shown, never deciding). */
function StepAnalysisTable({ steps }: { steps: RolloutStep[] }) {
  return (
    <Table
      testId="steps-table"
      rows={steps}
      rowKey={(s) => s.index}
      columns={[
        {
          header: "Step",
          cell: (s) => (
            <span data-testid={`step-${s.index}`} data-status={s.status}>
              {formatShare(s.share)}
              {s.approval && <span className="muted"> (approval)</span>}
            </span>
          ),
        },
        { header: "Status", cell: (s) => s.status },
        {
          header: "Decision",
          className: "wrap",
          cell: (s) =>
            s.decision ? (
              <div data-testid={`step-decision-${s.index}`}>
                <strong data-action={s.decision.action}>{s.decision.action}</strong> by {s.decision.actor_name}, {formatDateTime(s.decision.created_at)}
                <div className="decision-reason">{s.decision.reason}</div>
                {s.candidate_requests !== null && (
                  <div className="muted">
                    {s.candidate_requests} candidate and {s.baseline_requests ?? 0} baseline requests in the step
                  </div>
                )}
              </div>
            ) : (
              <span className="muted">—</span>
            ),
        },
        {
          header: "Analysis",
          className: "wrap",
          cell: (s) =>
            s.metrics.length ? (
              <ul className="step-metrics" data-testid={`step-metrics-${s.index}`}>
                {s.metrics.map((m) => (
                  <li key={m.key} data-metric={m.key} data-outcome={m.outcome} title={m.detail}>
                    {m.outcome ? <StatusBadge status={m.outcome} tone={OUTCOME_TONES[m.outcome] ?? "off"} /> : null} <code>{m.key}</code>
                    {m.dry_run && <span className="dry-run"> dry run</span>}: {metricSummary(m)}
                  </li>
                ))}
              </ul>
            ) : (
              <span className="muted">not measured yet</span>
            ),
        },
      ]}
    />
  );
}

function StartRolloutDialog({ onClose, onDone }: { onClose: () => void; onDone: (r: RolloutDetail) => void }) {
  const aliases = useApi<ApiPage<ModelAlias>>("/api/model-aliases/", { limit: 200 });
  const versions = useApi<ApiPage<ModelVersion>>("/api/model-versions/", { limit: 200 });
  const [alias, setAlias] = useState("");
  const [candidate, setCandidate] = useState("");
  const [steps, setSteps] = useState("1, 5, 25, 50, 100");
  const [minSeconds, setMinSeconds] = useState("300");
  const [minRequests, setMinRequests] = useState("100");
  const [signoff, setSignoff] = useState(false);
  const [gates, setGates] = useState<Record<string, string>>({ max_error_rate_delta: "0.02", max_p95_latency_ratio: "1.5" });
  const [approvals, setApprovals] = useState("");
  const [limits, setLimits] = useState<Record<string, string>>({});
  const [dryRun, setDryRun] = useState<Record<string, boolean>>({});
  const [localError, setLocalError] = useState<Record<string, string[]>>({});
  const { error, busy, run, errors } = useFormState();
  const aliasList = aliases.data?.results ?? [];
  const chosenAlias = aliasList.find((a) => String(a.id) === alias) ?? aliasList[0];
  const candidates = useMemo(
    () => (versions.data?.results ?? []).filter((v) => v.state !== "failed" && v.id !== chosenAlias?.active_version),
    [versions.data, chosenAlias],
  );
  const candidateValue = candidate || (candidates[0] ? String(candidates[0].id) : "");

  const submit = (event: FormEvent) => {
    event.preventDefault();
    const parsed = parseSteps(steps);
    if ("bad" in parsed) {
      setLocalError({ steps: [`"${parsed.bad}" is not a number.`] });
      return;
    }
    const approvalSteps = parseSteps(approvals);
    if ("bad" in approvalSteps) {
      setLocalError({ approval_steps: [`"${approvalSteps.bad}" is not a number.`] });
      return;
    }
    setLocalError({});
    const gateValues: Record<string, number> = {};
    for (const [key, raw] of Object.entries(gates)) if (raw.trim() !== "") gateValues[key] = Number(raw);
    const analysis: Record<string, unknown> = {};
    for (const f of LIMIT_FIELDS) if ((limits[f.key] ?? "").trim() !== "") analysis[f.key] = Number(limits[f.key]);
    const metrics: Record<string, { dry_run: boolean }> = {};
    for (const [key, on] of Object.entries(dryRun)) if (on && key in gateValues) metrics[key] = { dry_run: true };
    if (Object.keys(metrics).length) analysis.metrics = metrics;
    void run(async () => {
      const created = await api.post<RolloutDetail>("/api/rollouts/", {
        alias: chosenAlias ? chosenAlias.id : null,
        candidate_version: candidateValue ? Number(candidateValue) : null,
        steps: parsed.steps,
        gates: gateValues,
        min_step_seconds: Number(minSeconds),
        min_step_requests: Number(minRequests),
        require_signoff: signoff,
        analysis,
        approval_steps: approvalSteps.steps,
      });
      onDone(created);
    });
  };
  const fieldErrors = { ...(errors ?? {}), ...localError };
  return (
    <Dialog title="Start a rollout" open onClose={onClose} testId="start-rollout-dialog" wide>
      <form onSubmit={submit} noValidate>
        <div className="form-grid">
          <SelectField
            label="Alias"
            name="alias"
            value={chosenAlias ? String(chosenAlias.id) : ""}
            onChange={(e) => setAlias(e.target.value)}
            errors={fieldErrors}
            options={aliasList.map((a) => ({ value: String(a.id), label: `${a.name} (now ${a.active_version_label})` }))}
          />
          <SelectField
            label="Candidate version"
            name="candidate_version"
            value={candidateValue}
            onChange={(e) => setCandidate(e.target.value)}
            errors={fieldErrors}
            hint="Needs a ready deployment serving the alias."
            options={candidates.map((v) => ({ value: String(v.id), label: `${v.model_name}@${v.revision}` }))}
          />
          <InputField label="Steps (%)" name="steps" value={steps} onChange={(e) => setSteps(e.target.value)} errors={fieldErrors} hint="Rising, ending at 100." />
          <InputField label="Min seconds per step" name="min_step_seconds" type="number" min={0} value={minSeconds} onChange={(e) => setMinSeconds(e.target.value)} errors={fieldErrors} />
          <InputField label="Min candidate requests per step" name="min_step_requests" type="number" min={1} value={minRequests} onChange={(e) => setMinRequests(e.target.value)} errors={fieldErrors} />
          <InputField label="Wait for approval at (%)" name="approval_steps" value={approvals} onChange={(e) => setApprovals(e.target.value)} errors={fieldErrors} hint="e.g. 25: an admin approves before the rollout goes on." />
        </div>
        <fieldset className="gate-fields">
          <legend>Gates (leave empty for none)</legend>
          <div className="form-grid">
            {GATE_FIELDS.map((g) => (
              <InputField
                key={g.key}
                label={g.label}
                name={`gates.${g.key}`}
                type="number"
                step="any"
                value={gates[g.key] ?? ""}
                onChange={(e) => setGates({ ...gates, [g.key]: e.target.value })}
                hint={g.hint}
              />
            ))}
          </div>
        </fieldset>
        <fieldset className="gate-fields">
          <legend>Analysis limits (leave empty for the defaults)</legend>
          <div className="form-grid">
            {LIMIT_FIELDS.map((f) => (
              <InputField
                key={f.key}
                label={f.label}
                name={`analysis.${f.key}`}
                type="number"
                min={0}
                value={limits[f.key] ?? ""}
                onChange={(e) => setLimits({ ...limits, [f.key]: e.target.value })}
                hint={f.hint}
              />
            ))}
          </div>
          <div className="dry-run-fields">
            <span className="muted">Dry run (measured and shown, never deciding):</span>
            {GATE_FIELDS.filter((g) => (gates[g.key] ?? "").trim() !== "").map((g) => (
              <CheckboxField
                key={g.key}
                label={g.key}
                name={`dry_run.${g.key}`}
                checked={dryRun[g.key] ?? false}
                onChange={(e) => setDryRun({ ...dryRun, [g.key]: e.target.checked })}
              />
            ))}
          </div>
        </fieldset>
        {fieldErrors.analysis && (
          <div className="field-error" role="alert">
            {fieldErrors.analysis.join(" ")}
          </div>
        )}
        <CheckboxField label="Require a signed-off offline evaluation before promotion" name="require_signoff" checked={signoff} onChange={(e) => setSignoff(e.target.checked)} errors={fieldErrors} />
        {fieldErrors.gates && (
          <div className="field-error" role="alert">
            {fieldErrors.gates.join(" ")}
          </div>
        )}
        <FormErrors
          error={error}
          fields={["alias", "candidate_version", "steps", "gates", "min_step_seconds", "min_step_requests", "require_signoff", "analysis", "approval_steps"]}
        />
        <div className="form-actions">
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            Start
          </button>
        </div>
      </form>
    </Dialog>
  );
}

function ShadowCard() {
  const { isAdmin } = useAuth();
  const configs = useApi<ApiPage<ShadowConfig>>("/api/shadow-configs/", { limit: 200 });
  const [editing, setEditing] = useState<ShadowConfig | "new" | null>(null);
  return (
    <Card
      title="Shadow traffic"
      testId="shadow-card"
      actions={
        isAdmin && (
          <button type="button" className="btn btn-small" onClick={() => setEditing("new")}>
            New shadow
          </button>
        )
      }
    >
      <p className="muted">A share of live requests (from tenants that consent) is mirrored to a candidate after the primary answered; clients never see its answers.</p>
      <ErrorState error={configs.error} onRetry={configs.reload} />
      <Table
        testId="shadow-table"
        rows={configs.data?.results}
        loading={configs.loading}
        rowKey={(s) => s.id}
        onRowClick={isAdmin ? setEditing : undefined}
        empty="No shadow traffic configured."
        columns={[
          { header: "Alias", cell: (s) => <code>{s.alias_name}</code> },
          { header: "Candidate", wrap: true, cell: (s) => s.candidate_label },
          { header: "Mirrored", cell: (s) => formatShare(s.percent) },
          { header: "State", cell: (s) => <StatusBadge status={s.enabled ? "active" : "inactive"} /> },
          { header: "Max in flight", cell: (s) => s.max_inflight },
          {
            header: "Pairs",
            cell: (s) => (
              // Its own page; the row's click (an admin's edit) must not fire as well.
              <Link to={`/rollouts/shadow/${encodeURIComponent(s.alias_name)}`} onClick={(e) => e.stopPropagation()} data-testid="shadow-pairs-link">
                Review pairs
              </Link>
            ),
          },
        ]}
      />
      {editing && (
        <ShadowDialog
          config={editing === "new" ? null : editing}
          onClose={() => setEditing(null)}
          onDone={() => {
            setEditing(null);
            configs.reload();
          }}
        />
      )}
    </Card>
  );
}

function ShadowDialog({ config, onClose, onDone }: { config: ShadowConfig | null; onClose: () => void; onDone: () => void }) {
  const aliases = useApi<ApiPage<ModelAlias>>("/api/model-aliases/", { limit: 200 });
  const versions = useApi<ApiPage<ModelVersion>>("/api/model-versions/", { limit: 200 });
  const [alias, setAlias] = useState(config ? String(config.alias) : "");
  const [candidate, setCandidate] = useState(config ? String(config.candidate_version) : "");
  const [percent, setPercent] = useState(config ? String(config.percent) : "10");
  const [enabled, setEnabled] = useState(config ? config.enabled : true);
  const { error, busy, run, errors } = useFormState();
  const aliasValue = alias || String(aliases.data?.results[0]?.id ?? "");
  const versionList = (versions.data?.results ?? []).filter((v) => v.state !== "failed");
  const candidateValue = candidate || String(versionList[0]?.id ?? "");

  const submit = (event: FormEvent) => {
    event.preventDefault();
    const body = { alias: Number(aliasValue), candidate_version: Number(candidateValue), percent: Number(percent), enabled };
    void run(async () => {
      if (config) await api.patch(`/api/shadow-configs/${config.id}/`, body);
      else await api.post("/api/shadow-configs/", body);
      onDone();
    });
  };
  const remove = () =>
    void run(async () => {
      if (config) await api.delete(`/api/shadow-configs/${config.id}/`);
      onDone();
    });
  return (
    <Dialog title={config ? `Shadow for ${config.alias_name}` : "New shadow"} open onClose={onClose} testId="shadow-dialog">
      <form onSubmit={submit} noValidate>
        <SelectField label="Alias" name="alias" value={aliasValue} onChange={(e) => setAlias(e.target.value)} errors={errors} options={(aliases.data?.results ?? []).map((a) => ({ value: String(a.id), label: a.name }))} />
        <SelectField label="Candidate version" name="candidate_version" value={candidateValue} onChange={(e) => setCandidate(e.target.value)} errors={errors} options={versionList.map((v) => ({ value: String(v.id), label: `${v.model_name}@${v.revision}` }))} />
        <InputField label="Mirrored (%)" name="percent" type="number" step="any" value={percent} onChange={(e) => setPercent(e.target.value)} errors={errors} hint="0 to 100" />
        <CheckboxField label="Enabled" name="enabled" checked={enabled} onChange={(e) => setEnabled(e.target.checked)} errors={errors} />
        <FormErrors error={error} fields={["alias", "candidate_version", "percent", "enabled"]} />
        <div className="form-actions">
          {config && (
            <button type="button" className="btn btn-danger" onClick={remove} disabled={busy}>
              Delete
            </button>
          )}
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            Save
          </button>
        </div>
      </form>
    </Dialog>
  );
}
