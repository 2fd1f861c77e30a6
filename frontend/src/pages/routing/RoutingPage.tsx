import { useEffect, useState } from "react";
import { Link } from "react-router-dom";
import { ApiError, api } from "../../api/client";
import type { Page as ApiPage, RefusedTraffic, RoutedTraffic, RoutePolicy, RoutePool, Scorer, Traffic } from "../../api/types";
import { useAuth } from "../../auth";
import { PoolCostCard } from "../../components/Cost";
import { Dialog } from "../../components/Dialog";
import { CheckboxField, InputField, SelectField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { Table } from "../../components/Table";
import { formatNumber } from "../../format";
import { useApi } from "../../hooks/useApi";
import { PoolHistory } from "./PoolHistory";
import { PredictionsCard } from "./PredictionsCard";
import { ScalingCard } from "./ScalingCard";
import "./routing.css";
import { SCORERS, describeMatch } from "./rules";

const TRAFFIC_REFRESH_MS = 5000;
const BATCH_SHARE_HELP =
  "Share of the pool's capacity batch requests may fill: past it they get 429, the rest is headroom for interactive traffic.";

export function RoutingPage() {
  const { isAdmin } = useAuth();
  const pools = useApi<ApiPage<RoutePool>>("/api/route-pools/", { limit: 200 });
  const policies = useApi<ApiPage<RoutePolicy>>("/api/route-policies/", { limit: 200 });
  const [editing, setEditing] = useState<RoutePool | "new" | null>(null);

  return (
    <Page
      title="Routing"
      subtitle="How /v1/ requests pick a pool (policies) and an endpoint inside it (scorers), and where traffic goes now."
      actions={
        <>
          <Link className="btn" to="/routing/chains" data-testid="stage-chains-link">
            Stage chains
          </Link>{" "}
          {isAdmin && (
            <button type="button" className="btn btn-primary" onClick={() => setEditing("new")}>
              New pool
            </button>
          )}
        </>
      }
    >
      <TrafficCard />
      <PoolHistory pools={pools.data?.results ?? []} />
      <PredictionsCard />
      <Card title="Pools" testId="pools-card">
        <ErrorState error={pools.error} onRetry={pools.reload} />
        <Table
          testId="pools-table"
          rows={pools.data?.results}
          loading={pools.loading}
          rowKey={(p) => p.id}
          onRowClick={isAdmin ? setEditing : undefined}
          empty="No pools yet: every alias routes to all its ready deployments (least outstanding)."
          columns={[
            {
              header: "Pool",
              cell: (p) => (
                <>
                  <strong>{p.name}</strong>
                  {p.sleep_idle_seconds !== null && (
                    // Idle sleep under the name, so the table keeps its width: scale to zero lets every engine sleep.
                    <div className="muted" data-testid={`pool-sleep-${p.name}`} title="Idle sleep of the pool's engines, at level 1 or 2">
                      {p.scale_to_zero ? "to zero" : "1 awake"} · {p.sleep_idle_seconds} s · L{p.sleep_level}
                    </div>
                  )}
                </>
              ),
            },
            { header: "Alias", cell: (p) => <code>{p.alias}</code> },
            { header: "Role", cell: (p) => p.role || <span className="muted">any</span> },
            {
              header: "Scorer",
              cell: (p) =>
                p.scorer === "weighted"
                  ? `weighted ${Object.entries(p.scorer_weights).map(([k, v]) => `${k}=${v}`).join(" ")}`
                  : p.scorer.replace(/_/g, " "),
            },
            {
              // A short header keeps the table within the card; the order is in its tooltip.
              header: <span title="connect / first byte / between tokens / total, in seconds">Timeouts</span>,
              cell: (p) => `${p.connect_timeout_s}/${p.first_byte_timeout_s}/${p.inter_token_timeout_s}/${p.total_timeout_s} s`,
            },
            { header: "Retries", cell: (p) => p.max_retries },
            { header: "Saturated at", cell: (p) => `${p.max_inflight_per_endpoint} / endpoint` },
            {
              header: <span title={BATCH_SHARE_HELP}>Batch share</span>,
              cell: (p) => <span title={BATCH_SHARE_HELP}>{formatFraction(p.batch_max_fraction)}</span>,
            },
          ]}
        />
      </Card>
      <ScalingCard pools={pools.data?.results ?? []} />
      <PoolCostCard />
      <Card title="Policies" testId="policies-card">
        <ErrorState error={policies.error} onRetry={policies.reload} />
        {policies.data?.results.length === 0 && <p className="muted">No policies: each alias uses its own pool.</p>}
        {policies.data?.results.map((policy) => (
          <div key={policy.id} className="policy" data-testid={`policy-${policy.alias}`}>
            <h3>
              {policy.name} <span className="muted">for</span> <code>{policy.alias}</code>
            </h3>
            <ol>
              {policy.rules.map((rule, index) => (
                <li key={index}>
                  if {describeMatch(rule.match)} → <strong>{rule.pool}</strong>
                </li>
              ))}
              <li>
                otherwise → <strong>{policy.default_pool ?? `${policy.alias} (its own pool)`}</strong>
              </li>
            </ol>
            <p className="muted">
              Fallback when the chosen pool has no healthy endpoint: {policy.fallback_pool ?? "none (503)"}
            </p>
          </div>
        ))}
      </Card>
      {editing !== null && (
        <PoolDialog
          pool={editing === "new" ? null : editing}
          onClose={() => setEditing(null)}
          onSaved={() => {
            setEditing(null);
            pools.reload();
          }}
        />
      )}
    </Page>
  );
}

/** Where routed requests went over the last five minutes (per pool, each deployment's share of its pool),
 * and apart from that, the requests refused before any pool was chosen: they are not traffic of a pool. */
function TrafficCard() {
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const timer = window.setInterval(() => setTick((n) => n + 1), TRAFFIC_REFRESH_MS);
    return () => window.clearInterval(timer);
  }, []);
  const traffic = useApi<Traffic>("/api/routing/traffic/", { minutes: 5, tick });
  const byPool = new Map<string, RoutedTraffic[]>();
  for (const row of traffic.data?.routed ?? []) {
    const list = byPool.get(row.route_pool) ?? [];
    list.push(row);
    byPool.set(row.route_pool, list);
  }
  const refused = traffic.data?.refused ?? [];
  const idle = traffic.data !== undefined && byPool.size === 0 && refused.length === 0;
  return (
    <Card title="Live traffic split (last 5 minutes)" testId="traffic-card">
      <ErrorState error={traffic.error} onRetry={traffic.reload} />
      {idle && <p className="muted">No requests in the last five minutes.</p>}
      {traffic.data && byPool.size === 0 && !idle && <p className="muted">No request was routed in the last five minutes.</p>}
      {[...byPool.entries()].map(([pool, rows]) => {
        const total = rows.reduce((sum, r) => sum + r.requests, 0);
        return (
          <div key={pool} className="traffic-pool" data-testid={`traffic-pool-${pool}`}>
            <h3>
              {pool} <span className="muted">{formatNumber(total)} requests</span>
            </h3>
            {rows.map((row) => {
              const share = total ? (row.requests / total) * 100 : 0;
              return (
                <div key={`${row.deployment_id}-${row.upstream}`} className="traffic-row" data-testid="traffic-row">
                  <span className="traffic-label">
                    {row.deployment_id !== null ? `deployment #${row.deployment_id}` : row.upstream || "no healthy endpoint"}
                  </span>
                  <span className="traffic-bar" aria-hidden="true">
                    <span style={{ width: `${share}%` }} />
                  </span>
                  <span className="traffic-figures">
                    {share.toFixed(0)}% · {formatNumber(row.requests)} req
                    {row.errors ? <span className="routing-bad"> · {row.errors} 5xx</span> : null}
                  </span>
                </div>
              );
            })}
          </div>
        );
      })}
      {refused.length > 0 && <RefusedBeforeRouting rows={refused} />}
    </Card>
  );
}

/** Refusals (limits, bad requests, unknown models) never reached a pool: counted by reason, with no bar. */
function RefusedBeforeRouting({ rows }: { rows: RefusedTraffic[] }) {
  const total = rows.reduce((sum, r) => sum + r.requests, 0);
  return (
    <div className="traffic-refused" data-testid="traffic-refused">
      <h3>
        Refused before routing <span className="muted">{formatNumber(total)} requests, not part of any pool's split</span>
      </h3>
      <ul>
        {rows.map((row) => (
          <li key={`${row.status}-${row.error_type}`} data-testid="refused-row">
            <span className="routing-bad">{row.status}</span> {row.error_type || <span className="muted">no error type</span>} ·{" "}
            {formatNumber(row.requests)} req
          </li>
        ))}
      </ul>
    </div>
  );
}

interface PoolForm {
  name: string;
  alias: string;
  role: string;
  scorer: Scorer;
  connect_timeout_s: string;
  first_byte_timeout_s: string;
  inter_token_timeout_s: string;
  total_timeout_s: string;
  max_retries: string;
  max_inflight_per_endpoint: string;
  batch_max_fraction: string;
  sleep_idle_seconds: string;
  sleep_level: string;
  scale_to_zero: boolean;
  wake_timeout_s: string;
}

/** 0.8 -> "80%"; keeps one decimal for shares such as 0.125. */
function formatFraction(value: number): string {
  return `${Number((value * 100).toFixed(1))}%`;
}

function PoolDialog({ pool, onClose, onSaved }: { pool: RoutePool | null; onClose: () => void; onSaved: () => void }) {
  const [form, setForm] = useState<PoolForm>({
    name: pool?.name ?? "",
    alias: pool?.alias ?? "",
    role: pool?.role ?? "",
    scorer: pool?.scorer ?? "least_outstanding",
    connect_timeout_s: String(pool?.connect_timeout_s ?? 2),
    first_byte_timeout_s: String(pool?.first_byte_timeout_s ?? 60),
    inter_token_timeout_s: String(pool?.inter_token_timeout_s ?? 30),
    total_timeout_s: String(pool?.total_timeout_s ?? 600),
    max_retries: String(pool?.max_retries ?? 2),
    max_inflight_per_endpoint: String(pool?.max_inflight_per_endpoint ?? 64),
    batch_max_fraction: String(pool?.batch_max_fraction ?? 0.8),
    sleep_idle_seconds: pool?.sleep_idle_seconds == null ? "" : String(pool.sleep_idle_seconds),
    sleep_level: String(pool?.sleep_level ?? 1),
    scale_to_zero: pool?.scale_to_zero ?? false,
    wake_timeout_s: String(pool?.wake_timeout_s ?? 30),
  });
  const [error, setError] = useState<ApiError | null>(null);
  const [saving, setSaving] = useState(false);
  const set = (name: keyof PoolForm) => (e: { target: { value: string } }) => setForm({ ...form, [name]: e.target.value });

  async function save() {
    setSaving(true);
    const body = {
      ...form,
      connect_timeout_s: Number(form.connect_timeout_s),
      first_byte_timeout_s: Number(form.first_byte_timeout_s),
      inter_token_timeout_s: Number(form.inter_token_timeout_s),
      total_timeout_s: Number(form.total_timeout_s),
      max_retries: Number(form.max_retries),
      max_inflight_per_endpoint: Number(form.max_inflight_per_endpoint),
      // Sent as typed: the API says why a value outside 0..1 is refused, next to the field.
      batch_max_fraction: form.batch_max_fraction.trim() === "" ? form.batch_max_fraction : Number(form.batch_max_fraction),
      // Empty: no idle sleep.
      sleep_idle_seconds: form.sleep_idle_seconds.trim() === "" ? null : Number(form.sleep_idle_seconds),
      sleep_level: Number(form.sleep_level),
      wake_timeout_s: Number(form.wake_timeout_s),
    };
    try {
      if (pool) await api.patch(`/api/route-pools/${pool.id}/`, body);
      else await api.post("/api/route-pools/", body);
      onSaved();
    } catch (err) {
      if (err instanceof ApiError) setError(err);
      else throw err;
    } finally {
      setSaving(false);
    }
  }

  const errors = error?.fieldErrors;
  return (
    <Dialog
      title={pool ? `Edit pool ${pool.name}` : "New pool"}
      open
      onClose={onClose}
      testId="pool-dialog"
      footer={
        <>
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
      <div className="grid-2">
        <InputField label="Name" name="name" value={form.name} onChange={set("name")} errors={errors} />
        <InputField label="Model alias" name="alias" value={form.alias} onChange={set("alias")} errors={errors} hint="The served model name of its deployments." />
        <InputField label="Deployment role" name="role" value={form.role} onChange={set("role")} errors={errors} hint="Empty: every role." />
        <SelectField label="Scorer" name="scorer" options={SCORERS} value={form.scorer} onChange={set("scorer")} errors={errors} />
        <InputField label="Connect timeout (s)" name="connect_timeout_s" type="number" step="0.1" value={form.connect_timeout_s} onChange={set("connect_timeout_s")} errors={errors} />
        <InputField label="First-byte timeout (s)" name="first_byte_timeout_s" type="number" step="0.1" value={form.first_byte_timeout_s} onChange={set("first_byte_timeout_s")} errors={errors} />
        <InputField label="Inter-token timeout (s)" name="inter_token_timeout_s" type="number" step="0.1" value={form.inter_token_timeout_s} onChange={set("inter_token_timeout_s")} errors={errors} />
        <InputField label="Total timeout (s)" name="total_timeout_s" type="number" step="1" value={form.total_timeout_s} onChange={set("total_timeout_s")} errors={errors} />
        <InputField label="Retries on another endpoint" name="max_retries" type="number" value={form.max_retries} onChange={set("max_retries")} errors={errors} />
        <InputField label="Saturated at (in flight per endpoint)" name="max_inflight_per_endpoint" type="number" value={form.max_inflight_per_endpoint} onChange={set("max_inflight_per_endpoint")} errors={errors} />
        <InputField
          label="Batch share (0 to 1)"
          name="batch_max_fraction"
          type="number"
          step="0.05"
          value={form.batch_max_fraction}
          onChange={set("batch_max_fraction")}
          errors={errors}
          hint="Of the pool's capacity; past it batch requests get 429, the rest is headroom for interactive ones."
        />
        <InputField
          label="Sleep after idle (s)"
          name="sleep_idle_seconds"
          type="number"
          value={form.sleep_idle_seconds}
          onChange={set("sleep_idle_seconds")}
          errors={errors}
          hint="Empty: engines never sleep. vLLM and simulator engines only; they restart once to get sleep mode."
        />
        <SelectField
          label="Sleep level"
          name="sleep_level"
          options={[
            { value: "1", label: "1: weights to host memory (faster wake)" },
            { value: "2", label: "2: weights dropped (least memory)" },
          ]}
          value={form.sleep_level}
          onChange={set("sleep_level")}
          errors={errors}
        />
        <CheckboxField
          label="Scale to zero"
          name="scale_to_zero"
          checked={form.scale_to_zero}
          onChange={(e) => setForm({ ...form, scale_to_zero: e.target.checked })}
          errors={errors}
          hint="Every engine may sleep; otherwise one stays awake. The first request wakes one."
        />
        <InputField
          label="Wake timeout (s)"
          name="wake_timeout_s"
          type="number"
          step="0.5"
          value={form.wake_timeout_s}
          onChange={set("wake_timeout_s")}
          errors={errors}
          hint="How long a request is held while an engine wakes; then 503 with Retry-After."
        />
      </div>
    </Dialog>
  );
}
