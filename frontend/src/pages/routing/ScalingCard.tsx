// Pool autoscaling on the routing page: each pool's scaling policy (engines now and the target, the latest
// reason, the decision history) and, for admins, a form to add or edit it (docs/autoscaling.md).
import { useEffect, useState } from "react";
import { ApiError, api } from "../../api/client";
import type { Deployment, Page as ApiPage, RoutePool, ScalingAction, ScalingDecision, ScalingPolicy } from "../../api/types";
import { useAuth } from "../../auth";
import { Dialog } from "../../components/Dialog";
import { InputField, SelectField } from "../../components/Field";
import { Card, ErrorState } from "../../components/Page";
import { StatusBadge, type BadgeTone } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatDateTime, formatPct } from "../../format";
import { useApi } from "../../hooks/useApi";

const REFRESH_MS = 5000;
const ACTION_TONE: Record<ScalingAction, BadgeTone> = { scale_up: "info", scale_down: "ok", replace: "warn", blocked: "bad" };

export function ScalingCard({ pools }: { pools: RoutePool[] }) {
  const { isAdmin } = useAuth();
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const timer = window.setInterval(() => setTick((n) => n + 1), REFRESH_MS);
    return () => window.clearInterval(timer);
  }, []);
  const policies = useApi<ApiPage<ScalingPolicy>>("/api/scaling-policies/", { limit: 200, tick });
  const [editing, setEditing] = useState<{ pool: RoutePool; policy: ScalingPolicy | null } | null>(null);
  const byPool = new Map((policies.data?.results ?? []).map((p) => [p.pool, p]));
  return (
    <Card title="Autoscaling" testId="scaling-card">
      <ErrorState error={policies.error} onRetry={policies.reload} />
      {pools.length === 0 && <p className="muted">No pools: a scaling policy belongs to a pool.</p>}
      {pools.map((pool) => {
        const policy = byPool.get(pool.id) ?? null;
        return (
          <div key={pool.id} className="scaling-pool" data-testid={`scaling-${pool.name}`}>
            <h3>
              {pool.name}{" "}
              {policy ? (
                <StatusBadge status={policy.enabled ? "enabled" : "disabled"} tone={policy.enabled ? "ok" : "off"} />
              ) : (
                <span className="muted">fixed size</span>
              )}
              {isAdmin && (
                <button type="button" className="btn btn-small" onClick={() => setEditing({ pool, policy })} data-testid={`scaling-edit-${pool.name}`}>
                  {policy ? "Edit policy" : "Add scaling policy"}
                </button>
              )}
            </h3>
            {policy && <PolicySummary policy={policy} tick={tick} />}
          </div>
        );
      })}
      {editing && (
        <PolicyDialog
          pool={editing.pool}
          policy={editing.policy}
          onClose={() => setEditing(null)}
          onSaved={() => {
            setEditing(null);
            policies.reload();
          }}
        />
      )}
    </Card>
  );
}

function PolicySummary({ policy, tick }: { policy: ScalingPolicy; tick: number }) {
  const decisions = useApi<ScalingDecision[]>(`/api/scaling-policies/${policy.id}/decisions/`, { tick });
  const m = policy.last_metrics as Record<string, number | null | undefined>;
  const engines = policy.engines;
  return (
    <>
      <dl className="scaling-figures">
        <div>
          <dt>Engines now</dt>
          <dd data-testid="scaling-engines">
            {engines.serving} serving
            {engines.starting ? `, ${engines.starting} starting` : ""}
            {engines.draining ? `, ${engines.draining} draining` : ""}
          </dd>
        </div>
        <div>
          <dt>Target</dt>
          <dd data-testid="scaling-target">{policy.last_target_engines ?? "—"}</dd>
        </div>
        <div>
          <dt>Bounds</dt>
          <dd>
            {policy.min_engines} to {policy.max_engines}
          </dd>
        </div>
        <div>
          <dt>Targets</dt>
          <dd>
            {policy.target_waiting_per_engine} waiting / engine · KV {formatPct(policy.target_kv_usage)}
            {policy.target_ttft_ratio ? ` · TTFT p95 ${policy.target_ttft_ratio}× baseline` : ""}
          </dd>
        </div>
        <div>
          <dt>Live</dt>
          <dd>
            {m.waiting_per_engine ?? "—"} waiting / engine · KV {m.kv_usage == null ? "—" : formatPct(m.kv_usage)}
            {m.ttft_ratio ? ` · TTFT ${m.ttft_ratio}×` : ""}
          </dd>
        </div>
      </dl>
      <p className="muted" data-testid="scaling-reason">
        {policy.last_evaluated_at ? `${formatDateTime(policy.last_evaluated_at)}: ${policy.last_reason}` : "Not evaluated yet."}
      </p>
      <ErrorState error={decisions.error} onRetry={decisions.reload} />
      <Table
        testId="scaling-decisions"
        rows={decisions.data?.slice(0, 20)}
        loading={decisions.loading && decisions.data === undefined}
        rowKey={(d) => d.id}
        empty="No scaling decision yet."
        columns={[
          { header: "When", cell: (d) => formatDateTime(d.at) },
          { header: "Action", cell: (d) => <StatusBadge status={d.action} tone={ACTION_TONE[d.action]} label={d.action.replace("_", " ")} /> },
          { header: "Engines", cell: (d) => `${d.engines_before} → ${d.engines_after}` },
          { header: "Engine", cell: (d) => (d.deployment_name ? `${d.deployment_name}${d.host_name ? ` on ${d.host_name}` : ""}` : "—") },
          { header: "Why", cell: (d) => d.reason },
        ]}
      />
    </>
  );
}

interface PolicyForm {
  template: string;
  enabled: string;
  min_engines: string;
  max_engines: string;
  target_waiting_per_engine: string;
  target_kv_usage: string;
  target_ttft_ratio: string;
  scale_up_cooldown_s: string;
  scale_down_cooldown_s: string;
  evaluation_interval_s: string;
}

function PolicyDialog({ pool, policy, onClose, onSaved }: { pool: RoutePool; policy: ScalingPolicy | null; onClose: () => void; onSaved: () => void }) {
  const deployments = useApi<ApiPage<Deployment>>("/api/deployments/", { limit: 200 });
  const candidates = (deployments.data?.results ?? []).filter((d) => d.served_model_name === pool.alias && (!pool.role || d.role === pool.role));
  const [form, setForm] = useState<PolicyForm>({
    template: policy ? String(policy.template) : "",
    enabled: policy?.enabled === false ? "false" : "true",
    min_engines: String(policy?.min_engines ?? 1),
    max_engines: String(policy?.max_engines ?? 4),
    target_waiting_per_engine: String(policy?.target_waiting_per_engine ?? 2),
    target_kv_usage: String(policy?.target_kv_usage ?? 0.8),
    target_ttft_ratio: policy?.target_ttft_ratio == null ? "" : String(policy.target_ttft_ratio),
    scale_up_cooldown_s: String(policy?.scale_up_cooldown_s ?? 30),
    scale_down_cooldown_s: String(policy?.scale_down_cooldown_s ?? 300),
    evaluation_interval_s: String(policy?.evaluation_interval_s ?? 10),
  });
  const [error, setError] = useState<ApiError | null>(null);
  const [saving, setSaving] = useState(false);
  const set = (name: keyof PolicyForm) => (e: { target: { value: string } }) => setForm({ ...form, [name]: e.target.value });
  const template = form.template || (candidates[0] ? String(candidates[0].id) : "");

  async function save() {
    setSaving(true);
    const body = {
      pool: pool.id,
      template: template === "" ? null : Number(template),
      enabled: form.enabled === "true",
      min_engines: Number(form.min_engines),
      max_engines: Number(form.max_engines),
      target_waiting_per_engine: Number(form.target_waiting_per_engine),
      target_kv_usage: Number(form.target_kv_usage),
      target_ttft_ratio: form.target_ttft_ratio.trim() === "" ? null : Number(form.target_ttft_ratio),
      scale_up_cooldown_s: Number(form.scale_up_cooldown_s),
      scale_down_cooldown_s: Number(form.scale_down_cooldown_s),
      evaluation_interval_s: Number(form.evaluation_interval_s),
    };
    try {
      if (policy) await api.patch(`/api/scaling-policies/${policy.id}/`, body);
      else await api.post("/api/scaling-policies/", body);
      onSaved();
    } catch (err) {
      if (err instanceof ApiError) setError(err);
      else throw err;
    } finally {
      setSaving(false);
    }
  }

  async function remove() {
    if (!policy) return;
    await api.delete(`/api/scaling-policies/${policy.id}/`);
    onSaved();
  }

  const errors = error?.fieldErrors;
  return (
    <Dialog
      title={`Scaling of pool ${pool.name}`}
      open
      onClose={onClose}
      testId="scaling-dialog"
      footer={
        <>
          {policy && (
            <button type="button" className="btn btn-danger" onClick={() => void remove()}>
              Remove policy
            </button>
          )}
          <button type="button" className="btn" onClick={onClose}>
            Cancel
          </button>
          <button type="button" className="btn btn-primary" disabled={saving} onClick={() => void save()}>
            Save
          </button>
        </>
      }
    >
      {error?.generalErrors.map((message) => (
        <p key={message} className="routing-bad">
          {message}
        </p>
      ))}
      {errors?.["pool"] && <p className="routing-bad" role="alert">{errors["pool"].join(" ")}</p>}
      <div className="grid-2">
        <SelectField
          label="Template deployment"
          name="template"
          value={template}
          onChange={set("template")}
          errors={errors}
          options={candidates.map((d) => ({ value: String(d.id), label: `${d.name} (${d.host_name})` }))}
          hint="New engines copy its model version, quantization and engine arguments."
        />
        <SelectField label="Enabled" name="enabled" value={form.enabled} onChange={set("enabled")} errors={errors} options={[{ value: "true", label: "yes" }, { value: "false", label: "no" }]} />
        <InputField label="Minimum engines" name="min_engines" type="number" value={form.min_engines} onChange={set("min_engines")} errors={errors} />
        <InputField label="Maximum engines" name="max_engines" type="number" value={form.max_engines} onChange={set("max_engines")} errors={errors} />
        <InputField label="Waiting requests per engine" name="target_waiting_per_engine" type="number" step="0.5" value={form.target_waiting_per_engine} onChange={set("target_waiting_per_engine")} errors={errors} />
        <InputField label="KV-cache usage (0 to 1)" name="target_kv_usage" type="number" step="0.05" value={form.target_kv_usage} onChange={set("target_kv_usage")} errors={errors} />
        <InputField label="TTFT p95 over baseline (×)" name="target_ttft_ratio" type="number" step="0.1" value={form.target_ttft_ratio} onChange={set("target_ttft_ratio")} errors={errors} hint="Empty: not a target." />
        <InputField label="Evaluation interval (s)" name="evaluation_interval_s" type="number" value={form.evaluation_interval_s} onChange={set("evaluation_interval_s")} errors={errors} />
        <InputField label="Scale-up cooldown (s)" name="scale_up_cooldown_s" type="number" value={form.scale_up_cooldown_s} onChange={set("scale_up_cooldown_s")} errors={errors} />
        <InputField label="Scale-down cooldown (s)" name="scale_down_cooldown_s" type="number" value={form.scale_down_cooldown_s} onChange={set("scale_down_cooldown_s")} errors={errors} hint="Also how long the pool must stay quiet first." />
      </div>
    </Dialog>
  );
}
