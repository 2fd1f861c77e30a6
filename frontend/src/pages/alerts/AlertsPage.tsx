// Alerts: what fires now (and what is pending its for-duration), what resolved, every state change and
// acknowledgement, and the rules (fleet-wide rows and per-deployment or per-pool overrides). The beat task
// alerts.evaluate fills these (docs/monitoring.md "Alerts in the console"); admins acknowledge and edit.
import { useEffect, useState, type ReactNode } from "react";
import { ApiError, api } from "../../api/client";
import type { Alert, AlertDetail, AlertEvent, AlertMetric, AlertRule, AlertRuleInfo, AlertSummary, Deployment, Page as ApiPage, RoutePool } from "../../api/types";
import { useAuth } from "../../auth";
import { Dialog } from "../../components/Dialog";
import { CheckboxField, InputField, SelectField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge, type BadgeTone } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useLive } from "../../hooks/useLive";
import { useQueryParams } from "../../hooks/useQueryParams";

const REFRESH_MS = 10_000;
const TABS = [
  { key: "firing", label: "Firing" },
  { key: "resolved", label: "Resolved" },
  { key: "history", label: "History" },
  { key: "rules", label: "Rules" },
] as const;
type Tab = (typeof TABS)[number]["key"];

const SEVERITY_TONE: Record<string, BadgeTone> = { critical: "bad", warning: "warn", info: "info" };
const STATE_TONE: Record<string, BadgeTone> = { firing: "bad", pending: "warn", resolved: "ok", acknowledged: "info" };

/** 300 -> "5m", 90 -> "1m 30s", 0 -> "at once". */
export function formatFor(seconds: number): string {
  if (seconds === 0) return "at once";
  const parts: string[] = [];
  const h = Math.floor(seconds / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = seconds % 60;
  if (h) parts.push(`${h}h`);
  if (m) parts.push(`${m}m`);
  if (s) parts.push(`${s}s`);
  return parts.join(" ");
}

/** A counter that moves every `ms`, and at once when the live feed says an alert fired or resolved. */
function useRefreshTick(ms: number): number {
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const timer = window.setInterval(() => setTick((n) => n + 1), ms);
    return () => window.clearInterval(timer);
  }, [ms]);
  useLive([], (event) => event.type === "alerts" && setTick((n) => n + 1));
  return tick;
}

export function AlertsPage() {
  const query = useQueryParams();
  const tab: Tab = TABS.find((t) => t.key === query.get("tab"))?.key ?? "firing";
  const tick = useRefreshTick(REFRESH_MS);
  const summary = useApi<AlertSummary>("/api/alerts/summary/", { tick });
  return (
    <Page
      title="Alerts"
      subtitle="The Prometheus rules' conditions, evaluated by the control plane every few seconds: for teams without Alertmanager."
    >
      <nav aria-label="Alerts" className="alerts-tabs" style={{ display: "flex", gap: 4, marginBottom: 16, borderBottom: "1px solid var(--border)" }}>
        {TABS.map((t) => (
          <button
            key={t.key}
            type="button"
            role="tab"
            aria-selected={tab === t.key}
            data-testid={`alerts-tab-${t.key}`}
            onClick={() => query.set("tab", t.key === "firing" ? "" : t.key)}
            style={{
              padding: "8px 14px",
              background: "none",
              border: "none",
              cursor: "pointer",
              color: tab === t.key ? "var(--text)" : "var(--muted)",
              fontWeight: tab === t.key ? 600 : 400,
              borderBottom: tab === t.key ? "2px solid var(--primary)" : "2px solid transparent",
              marginBottom: -1,
            }}
          >
            {t.label}
            {t.key === "firing" && summary.data ? ` (${summary.data.firing})` : ""}
          </button>
        ))}
      </nav>
      {summary.data && !summary.data.webhook_configured && tab !== "rules" && (
        <p className="muted" data-testid="webhook-off">
          No webhook configured (ALERT_WEBHOOK_URL): alerts show here only.
        </p>
      )}
      {query.get("alert") && <AlertFocus id={query.get("alert") ?? ""} tick={tick} onClose={() => query.set("alert", "")} />}
      {tab === "firing" && <FiringTab tick={tick} />}
      {tab === "resolved" && <ResolvedTab tick={tick} />}
      {tab === "history" && <HistoryTab tick={tick} />}
      {tab === "rules" && <RulesTab />}
    </Page>
  );
}

/** One alert, opened from a link (`?alert=<id>`: the dashboard's hosts down link here): what, since when,
 * its state and its history. */
function AlertFocus({ id, tick, onClose }: { id: string; tick: number; onClose: () => void }) {
  const alert = useApi<AlertDetail>(/^\d+$/.test(id) ? `/api/alerts/${id}/` : null, { tick });
  const a = alert.data;
  return (
    <Card
      title={a ? <code>{a.alert}</code> : `Alert ${id}`}
      testId="alert-focus"
      actions={
        <button type="button" className="btn btn-small" onClick={onClose}>
          Close
        </button>
      }
    >
      <ErrorState error={alert.error} onRetry={alert.reload} />
      {a && (
        <>
          <p>
            <StatusBadge status={a.severity} tone={SEVERITY_TONE[a.severity]} /> <StatusBadge status={a.state} tone={STATE_TONE[a.state]} />{" "}
            <strong data-testid="alert-focus-summary">{a.summary}</strong>
          </p>
          <p className="muted">
            Started {formatDateTime(a.started_at)}
            {a.fired_at && <> · firing since {formatDateTime(a.fired_at)}</>}
            {a.resolved_at && <> · resolved {formatDateTime(a.resolved_at)}</>}
            {a.acknowledged_at && (
              <>
                {" "}
                · acknowledged by {a.acknowledged_by_name}, {formatDateTime(a.acknowledged_at)}
              </>
            )}
          </p>
          <ul className="timeline" data-testid="alert-focus-events">
            {a.events.map((e) => (
              <li key={e.id}>
                <time>{formatDateTime(e.at)}</time>
                <StatusBadge status={e.kind} tone={STATE_TONE[e.kind]} /> {e.actor_name}
              </li>
            ))}
          </ul>
        </>
      )}
    </Card>
  );
}

function alertColumns(extra: Array<{ header: string; cell: (a: Alert) => ReactNode }> = []) {
  return [
    { header: "Severity", cell: (a: Alert) => <StatusBadge status={a.severity} tone={SEVERITY_TONE[a.severity]} /> },
    { header: "Alert", cell: (a: Alert) => <code>{a.alert}</code> },
    { header: "Summary", cell: (a: Alert) => <span data-testid="alert-summary">{a.summary}</span>, className: "wrap cell-condition" },
    ...extra,
  ];
}

function FiringTab({ tick }: { tick: number }) {
  const { isAdmin } = useAuth();
  const firing = useApi<ApiPage<Alert>>("/api/alerts/", { state: "firing", limit: 200, tick });
  const pending = useApi<ApiPage<Alert>>("/api/alerts/", { state: "pending", limit: 200, tick });
  const [busy, setBusy] = useState<number | null>(null);
  const [error, setError] = useState<unknown>(null);

  async function acknowledge(alert: Alert) {
    setBusy(alert.id);
    setError(null);
    try {
      await api.post(`/api/alerts/${alert.id}/acknowledge/`);
      firing.reload();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(null);
    }
  }

  return (
    <>
      <Card title="Firing" testId="alerts-firing">
        <ErrorState error={firing.error ?? error} onRetry={firing.reload} />
        <Table
          testId="alerts-firing-table"
          rows={firing.data?.results}
          rowKey={(a) => a.id}
          empty="Nothing fires."
          columns={alertColumns([
            { header: "Since", cell: (a) => formatDateTime(a.fired_at) },
            {
              header: "Acknowledged",
              cell: (a) =>
                a.acknowledged_at ? (
                  <span data-testid="acknowledged-by">
                    {a.acknowledged_by_name}, {formatDateTime(a.acknowledged_at)}
                  </span>
                ) : isAdmin ? (
                  <button type="button" className="btn btn-small" data-testid={`acknowledge-${a.id}`} disabled={busy === a.id} onClick={() => void acknowledge(a)}>
                    Acknowledge
                  </button>
                ) : (
                  <span className="muted">not yet</span>
                ),
            },
          ])}
        />
      </Card>
      <Card title="Pending (the condition holds, not yet for its rule's for-duration)" testId="alerts-pending">
        <Table
          testId="alerts-pending-table"
          rows={pending.data?.results}
          rowKey={(a) => a.id}
          empty="Nothing pending."
          columns={alertColumns([
            { header: "Holding since", cell: (a) => formatDateTime(a.started_at) },
            { header: "Fires after", cell: (a) => formatFor(a.for_seconds) },
          ])}
        />
      </Card>
    </>
  );
}

function ResolvedTab({ tick }: { tick: number }) {
  const [offset, setOffset] = useState(0);
  const resolved = useApi<ApiPage<Alert>>("/api/alerts/", { state: "resolved", ordering: "-resolved_at", limit: 50, offset, tick });
  return (
    <Card title="Resolved" testId="alerts-resolved">
      <ErrorState error={resolved.error} onRetry={resolved.reload} />
      <Table
        testId="alerts-resolved-table"
        rows={resolved.data?.results}
        rowKey={(a) => a.id}
        empty="Nothing resolved yet."
        columns={alertColumns([
          { header: "Fired", cell: (a) => formatDateTime(a.fired_at) },
          { header: "Resolved", cell: (a) => formatDateTime(a.resolved_at) },
          { header: "Acknowledged by", cell: (a) => a.acknowledged_by_name || <span className="muted">nobody</span> },
        ])}
        pagination={resolved.data && resolved.data.count > 50 ? <PageButtons count={resolved.data.count} offset={offset} onOffset={setOffset} /> : undefined}
      />
    </Card>
  );
}

function PageButtons({ count, offset, onOffset }: { count: number; offset: number; onOffset: (n: number) => void }) {
  return (
    <div className="pagination">
      <span className="muted">
        {offset + 1}–{Math.min(offset + 50, count)} of {count}
      </span>
      <span className="pagination-buttons">
        <button type="button" className="btn btn-small" disabled={offset === 0} onClick={() => onOffset(Math.max(0, offset - 50))}>
          ← Previous
        </button>
        <button type="button" className="btn btn-small" disabled={offset + 50 >= count} onClick={() => onOffset(offset + 50)}>
          Next →
        </button>
      </span>
    </div>
  );
}

function HistoryTab({ tick }: { tick: number }) {
  const [offset, setOffset] = useState(0);
  const events = useApi<ApiPage<AlertEvent>>("/api/alert-events/", { limit: 50, offset, tick });
  return (
    <Card title="History" testId="alerts-history">
      <ErrorState error={events.error} onRetry={events.reload} />
      <Table
        testId="alerts-history-table"
        rows={events.data?.results}
        rowKey={(e) => e.id}
        empty="No alert has changed state yet."
        columns={[
          { header: "When", cell: (e) => formatDateTime(e.at) },
          { header: "Change", cell: (e) => <StatusBadge status={e.kind} tone={STATE_TONE[e.kind]} /> },
          { header: "Severity", cell: (e) => <StatusBadge status={e.severity} tone={SEVERITY_TONE[e.severity]} /> },
          { header: "Summary", cell: (e) => e.summary, className: "wrap" },
          { header: "By", cell: (e) => e.actor_name || <span className="muted">evaluator</span> },
        ]}
        pagination={events.data && events.data.count > 50 ? <PageButtons count={events.data.count} offset={offset} onOffset={setOffset} /> : undefined}
      />
    </Card>
  );
}

function describeThreshold(rule: { threshold: number | null; unit: string }): string {
  return rule.threshold === null ? "—" : `${rule.threshold} ${rule.unit}`;
}

function RulesTab() {
  const { isAdmin } = useAuth();
  const rules = useApi<ApiPage<AlertRule>>("/api/alert-rules/", { limit: 500 });
  const catalogue = useApi<AlertRuleInfo[]>("/api/alert-catalogue/");
  const [editing, setEditing] = useState<AlertRule | "new" | null>(null);
  const info = new Map((catalogue.data ?? []).map((c) => [c.metric, c]));
  return (
    <Card
      title="Rules"
      testId="alert-rules"
      actions={
        isAdmin ? (
          <button type="button" className="btn btn-primary" data-testid="new-override" onClick={() => setEditing("new")}>
            New override
          </button>
        ) : undefined
      }
    >
      <p className="muted">
        Fleet-wide rows start at deploy/prometheus/inferchain-rules.yml's thresholds. An override for a deployment or a pool (the deployments serving its
        alias) wins over the fleet row. Every edit is in the audit log.
      </p>
      <ErrorState error={rules.error} onRetry={rules.reload} />
      <Table
        testId="alert-rules-table"
        rows={rules.data?.results}
        rowKey={(r) => r.id}
        onRowClick={isAdmin ? setEditing : undefined}
        columns={[
          { header: "Alert", cell: (r) => <code>{r.alert}</code> },
          { header: "Applies to", cell: (r) => (r.scope === "fleet" ? <span className="muted">fleet</span> : `${r.scope} ${r.deployment_name ?? r.pool_name}`) },
          { header: "Threshold", cell: (r) => describeThreshold(r) },
          { header: "For", cell: (r) => formatFor(r.for_seconds) },
          { header: "Severity", cell: (r) => <StatusBadge status={r.severity} tone={SEVERITY_TONE[r.severity]} /> },
          { header: "Enabled", cell: (r) => (r.enabled ? "yes" : <span className="muted">off</span>) },
          { header: "Condition", cell: (r) => info.get(r.metric)?.condition ?? "", className: "wrap cell-condition" },
        ]}
      />
      {editing !== null && (
        <RuleDialog
          rule={editing === "new" ? null : editing}
          catalogue={catalogue.data ?? []}
          onClose={() => setEditing(null)}
          onSaved={() => {
            setEditing(null);
            rules.reload();
          }}
        />
      )}
    </Card>
  );
}

interface RuleForm {
  metric: AlertMetric;
  scope: "deployment" | "pool";
  target: string;
  threshold: string;
  for_seconds: string;
  enabled: boolean;
}

function RuleDialog({ rule, catalogue, onClose, onSaved }: { rule: AlertRule | null; catalogue: AlertRuleInfo[]; onClose: () => void; onSaved: () => void }) {
  const scoped = catalogue.filter((c) => c.scopes.length > 0);
  const first = scoped[0];
  const [form, setForm] = useState<RuleForm>({
    metric: rule?.metric ?? first?.metric ?? "engine_down",
    scope: "deployment",
    target: "",
    threshold: rule ? (rule.threshold === null ? "" : String(rule.threshold)) : first?.threshold === null || !first ? "" : String(first.threshold),
    for_seconds: String(rule?.for_seconds ?? first?.for_seconds ?? 0),
    enabled: rule?.enabled ?? true,
  });
  const deployments = useApi<ApiPage<Deployment>>(rule ? null : "/api/deployments/", { limit: 500 });
  const pools = useApi<ApiPage<RoutePool>>(rule ? null : "/api/route-pools/", { limit: 500 });
  const [error, setError] = useState<ApiError | null>(null);
  const [saving, setSaving] = useState(false);
  const definition = catalogue.find((c) => c.metric === form.metric);
  const hasThreshold = definition ? definition.threshold !== null : true;

  async function save() {
    setSaving(true);
    const threshold = !hasThreshold ? null : form.threshold.trim() === "" ? null : Number(form.threshold);
    // Sent as typed: the API says what is wrong with a value next to its field.
    const for_seconds = /^-?\d+$/.test(form.for_seconds.trim()) ? Number(form.for_seconds) : form.for_seconds;
    try {
      if (rule) {
        await api.patch(`/api/alert-rules/${rule.id}/`, { threshold, for_seconds, enabled: form.enabled });
      } else {
        await api.post("/api/alert-rules/", {
          metric: form.metric,
          [form.scope]: form.target ? Number(form.target) : null,
          threshold,
          for_seconds,
          enabled: form.enabled,
        });
      }
      onSaved();
    } catch (err) {
      if (err instanceof ApiError) setError(err);
      else throw err;
    } finally {
      setSaving(false);
    }
  }

  const errors = error?.fieldErrors;
  const targets =
    form.scope === "deployment"
      ? (deployments.data?.results ?? []).map((d) => ({ value: String(d.id), label: `${d.name} (${d.served_model_name})` }))
      : (pools.data?.results ?? []).map((p) => ({ value: String(p.id), label: `${p.name} (${p.alias})` }));
  const title = rule ? `Edit ${rule.alert} (${rule.scope === "fleet" ? "fleet" : `${rule.scope} ${rule.deployment_name ?? rule.pool_name}`})` : "New override";
  return (
    <Dialog
      title={title}
      open
      onClose={onClose}
      testId="rule-dialog"
      footer={
        <>
          {rule && rule.scope !== "fleet" && (
            <button
              type="button"
              className="btn btn-danger"
              onClick={() =>
                void api
                  .delete(`/api/alert-rules/${rule.id}/`)
                  .then(onSaved)
                  .catch((err: unknown) => err instanceof ApiError && setError(err))
              }
            >
              Delete override
            </button>
          )}
          <button type="button" className="btn" onClick={onClose}>
            Cancel
          </button>
          <button type="button" className="btn btn-primary" data-testid="rule-save" disabled={saving} onClick={() => void save()}>
            Save
          </button>
        </>
      }
    >
      {error?.generalErrors.map((message) => (
        <p key={message} className="field-error" role="alert">
          {message}
        </p>
      ))}
      {definition && <p className="muted">{definition.condition}</p>}
      <div className="grid-2">
        {!rule && (
          <>
            <SelectField
              label="Rule"
              name="metric"
              value={form.metric}
              errors={errors}
              options={scoped.map((c) => ({ value: c.metric, label: c.title }))}
              onChange={(e) => {
                const next = catalogue.find((c) => c.metric === e.target.value);
                setForm({
                  ...form,
                  metric: e.target.value as AlertMetric,
                  scope: next && !next.scopes.includes(form.scope) ? (next.scopes[0] as RuleForm["scope"]) : form.scope,
                  threshold: next?.threshold === null || !next ? "" : String(next.threshold),
                  for_seconds: String(next?.for_seconds ?? 0),
                });
              }}
            />
            <SelectField
              label="Applies to"
              name={form.scope}
              value={form.scope}
              errors={errors}
              options={(definition?.scopes ?? ["deployment", "pool"]).map((s) => ({ value: s, label: s }))}
              onChange={(e) => setForm({ ...form, scope: e.target.value as RuleForm["scope"], target: "" })}
            />
            <SelectField
              label={form.scope === "deployment" ? "Deployment" : "Pool"}
              name={`${form.scope}-target`}
              value={form.target}
              errors={errors}
              options={[{ value: "", label: "choose…" }, ...targets]}
              onChange={(e) => setForm({ ...form, target: e.target.value })}
            />
          </>
        )}
        {hasThreshold && (
          <InputField
            label={`Threshold (${definition?.unit ?? ""})`}
            name="threshold"
            type="number"
            step="any"
            value={form.threshold}
            errors={errors}
            hint={definition ? `Default ${definition.threshold}${definition.threshold_max !== null ? `, at most ${definition.threshold_max}` : ""}.` : undefined}
            onChange={(e) => setForm({ ...form, threshold: e.target.value })}
          />
        )}
        <InputField
          label="For (seconds)"
          name="for_seconds"
          value={form.for_seconds}
          errors={errors}
          hint={definition ? `How long the condition must hold before it fires; default ${definition.for_seconds} (${formatFor(definition.for_seconds)}).` : undefined}
          onChange={(e) => setForm({ ...form, for_seconds: e.target.value })}
        />
        <CheckboxField
          label="Enabled"
          name="enabled"
          checked={form.enabled}
          errors={errors}
          data-testid="rule-enabled"
          onChange={(e) => setForm({ ...form, enabled: e.target.checked })}
          hint="Off: the rule is not evaluated and its open alerts resolve."
        />
      </div>
    </Dialog>
  );
}
