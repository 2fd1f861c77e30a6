import { useState } from "react";
import { Dialog } from "../../components/Dialog";
import { DebouncedInputField, InputField, SelectField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatDateTime, formatNumber, isoToLocalInput, localInputToIso } from "../../format";
import { useApi, type ApiResource } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";
import "../routing/routing.css";
import type { Page as ApiPage, RequestLogPage, RequestLogRow, RequestLogStage, Tenant, UsageBucket } from "../../api/types";

const PAGE_SIZE = 50;
// Tenants offered by the picker (by name); a tenant beyond these still filters when its id is in the URL.
const TENANT_OPTIONS = 500;
const FILTERS = ["tenant_id", "alias", "status", "status_min", "since", "until", "cursor"] as const;
const OUTCOMES = [
  { value: "", label: "Any status" },
  { value: "200", label: "200 OK" },
  { value: "400+", label: "Errors (4xx and 5xx)" },
  { value: "429", label: "429 rate limited" },
  { value: "500+", label: "5xx" },
];

function cursorOf(url: string | null): string {
  return url ? (new URL(url, window.location.origin).searchParams.get("cursor") ?? "") : "";
}

function ms(value: number | null): string {
  return value === null ? "—" : value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`;
}

/** The cache stage that answered the request from its store, if one did. */
function cacheHit(r: RequestLogRow): string | null {
  const stage = (r.stages ?? []).find((s) => s.kind === "cache" && s.outcome === "hit");
  return stage ? stage.name : null;
}

/** "llama-fast → #7 · 1 retry": the pool, the deployment that answered, and the retries it took;
 * "cache hit · answers" for an answer replayed by a chain's cache stage (no pool, no engine). */
function routeText(r: RequestLogRow): string {
  const hit = cacheHit(r);
  if (hit !== null && !r.route_pool) return `cache hit · ${hit}`;
  const target = r.deployment_id !== null ? ` → #${r.deployment_id}` : "";
  const retries = r.retries ? ` · ${r.retries} ${r.retries === 1 ? "retry" : "retries"}` : "";
  return `${r.route_pool || "—"}${target}${retries}`;
}

/** The route cell's tooltip: the whole route, the upstream, why this pool was chosen, the chain's stages. */
function routeTitle(r: RequestLogRow): string {
  return [routeText(r), r.upstream, r.route_reason, ...(r.stages ?? []).map(stageText)].filter(Boolean).join("\n");
}

/** "answers (cache): hit, 0.4 ms": one stage of the request's chain. */
function stageText(s: RequestLogStage): string {
  return `${s.name} (${s.kind}): ${s.outcome}, ${ms(s.ms)}`;
}

/** A cell's text cut to the column's width with an ellipsis; the whole text is its tooltip. */
function Clip({ text, title, code, muted }: { text: string; title?: string; code?: boolean; muted?: boolean }) {
  const className = ["cell-clip", code ? "mono" : "", muted ? "muted" : ""].filter(Boolean).join(" ");
  return (
    <span className={className} title={title ?? text}>
      {text}
    </span>
  );
}

/** "acme" for a known tenant id, "#12" for one not (or not yet) loaded. */
function tenantLabel(id: string, tenants: Tenant[] | undefined): string {
  const tenant = tenants?.find((t) => String(t.id) === id);
  return tenant ? tenant.name : `#${id}`;
}

/** The tenant filter: a select of tenant names, whose value (the tenant id) is kept in the URL. */
function TenantPicker({ value, tenants, onChange }: { value: string; tenants: ApiResource<ApiPage<Tenant>>; onChange: (value: string) => void }) {
  const list = tenants.data?.results ?? [];
  const options = [
    { value: "", label: tenants.loading && !tenants.data ? "Loading tenants…" : "All tenants" },
    ...list.map((t) => ({ value: String(t.id), label: t.is_active === false ? `${t.name} (inactive)` : t.name })),
  ];
  // Keep an id from the URL selectable even when it is not among the loaded tenants (deleted, or past the limit).
  if (value && !list.some((t) => String(t.id) === value)) options.push({ value, label: `Tenant #${value}` });
  return (
    <SelectField
      label="Tenant"
      name="tenant_id"
      options={options}
      value={value}
      onChange={(e) => onChange(e.target.value)}
      hint={tenants.error ? "Could not load tenant names." : undefined}
    />
  );
}

export function RequestLogPage() {
  // Any change but paging starts again from the newest page (the cursor dropped).
  const { get, update, clear } = useQueryParams("cursor");
  const query: Record<string, string | number> = { page_size: PAGE_SIZE };
  for (const name of FILTERS) query[name] = get(name);
  const rows = useApi<RequestLogPage>("/api/request-log/", query);
  const tenants = useApi<ApiPage<Tenant>>("/api/tenants/", { limit: TENANT_OPTIONS, ordering: "name" });
  const tenantName = tenantLabel(get("tenant_id"), tenants.data?.results);
  const [open, setOpen] = useState<RequestLogRow | null>(null);
  const [generation, setGeneration] = useState(0);
  const outcome = get("status_min") ? `${get("status_min")}+` : get("status");
  const anyFilter = FILTERS.some((name) => name !== "cursor" && get(name));

  function setOutcome(value: string) {
    if (value.endsWith("+")) update({ status: "", status_min: value.slice(0, -1) });
    else update({ status: value, status_min: "" });
  }

  function filter(name: string, value: string) {
    update({ [name]: value });
  }

  return (
    <Page title="Request log" subtitle="Every /v1/ request: who, which model and endpoint, outcome, tokens and timings.">
      <UsageCard tenantId={get("tenant_id")} tenantName={tenantName} />
      <div className="filters" data-testid="request-filters">
        <TenantPicker value={get("tenant_id")} tenants={tenants} onChange={(value) => filter("tenant_id", value)} />
        <DebouncedInputField
          key={`alias-${generation}`}
          label="Model alias"
          name="alias"
          value={get("alias")}
          onCommit={(value) => filter("alias", value)}
        />
        <SelectField label="Status" name="outcome" options={OUTCOMES} value={outcome} onChange={(e) => setOutcome(e.target.value)} />
        <InputField label="From" name="since" type="datetime-local" value={isoToLocalInput(get("since"))} onChange={(e) => filter("since", localInputToIso(e.target.value))} />
        <InputField label="Until" name="until" type="datetime-local" value={isoToLocalInput(get("until"))} onChange={(e) => filter("until", localInputToIso(e.target.value))} />
        {anyFilter && (
          <button
            type="button"
            className="btn"
            onClick={() => {
              clear();
              setGeneration((n) => n + 1);
            }}
          >
            Clear filters
          </button>
        )}
      </div>
      <ErrorState error={rows.error} onRetry={rows.reload} />
      <div className="request-log">
        <Table
          testId="request-log-table"
          rows={rows.data?.results}
          loading={rows.loading}
          rowKey={(r) => r.id}
          onRowClick={setOpen}
          empty={anyFilter ? "No requests match these filters." : "No requests yet. Call /v1/ with an API key (see the README tour)."}
          columns={[
            { header: "When", cell: (r) => <span title={r.created_at}>{formatDateTime(r.created_at)}</span> },
            { header: "Tenant", cell: (r) => (r.tenant_name ? <Clip text={r.tenant_name} /> : <span className="muted">#{r.tenant_id}</span>) },
            { header: "Key", cell: (r) => <code>{r.key_prefix}…</code> },
            { header: "Model", cell: (r) => <Clip text={r.alias} code /> },
            {
              header: "Status",
              cell: (r) => (
                <span title={r.error_type ? `${r.status} ${r.error_type}` : undefined}>
                  <StatusBadge status={String(r.status)} tone={r.status < 400 ? "ok" : r.status === 429 ? "warn" : "bad"} label={r.error_type ? `${r.status} ${r.error_type}` : String(r.status)} />
                </span>
              ),
            },
            {
              header: "Tokens in / out",
              cell: (r) => `${formatNumber(r.prompt_tokens, "—")}${r.prompt_tokens_estimated ? "≈" : ""} / ${formatNumber(r.completion_tokens, "—")}`,
            },
            { header: "TTFT", cell: (r) => ms(r.ttft_ms) },
            { header: "Latency", cell: (r) => ms(r.latency_ms) },
            { header: "Route", cell: (r) => <Clip text={routeText(r)} title={routeTitle(r)} muted /> },
          ]}
          pagination={
            <div className="cursor-pager">
              <button type="button" className="btn" disabled={!rows.data?.previous} onClick={() => filter("cursor", cursorOf(rows.data?.previous ?? null))}>
                Newer
              </button>
              <button type="button" className="btn" disabled={!rows.data?.next} onClick={() => filter("cursor", cursorOf(rows.data?.next ?? null))}>
                Older
              </button>
            </div>
          }
        />
      </div>
      <RequestDialog row={open} onClose={() => setOpen(null)} />
    </Page>
  );
}

/** Requests per hour over the last day (errors in red), for the tenant in the filter or for everyone. */
function UsageCard({ tenantId, tenantName }: { tenantId: string; tenantName: string }) {
  const usage = useApi<UsageBucket[]>("/api/routing/usage/", tenantId ? { hours: 24, tenant_id: tenantId } : { hours: 24 });
  const buckets = usage.data ?? [];
  const peak = Math.max(1, ...buckets.map((b) => b.requests));
  const tokens = buckets.reduce((sum, b) => sum + b.prompt_tokens + b.completion_tokens, 0);
  const requests = buckets.reduce((sum, b) => sum + b.requests, 0);
  const width = 24 * 20;
  return (
    <Card title={tenantId ? `Usage of tenant ${tenantName}, last 24 hours` : "Usage, last 24 hours (all tenants)"} testId="usage-card">
      <ErrorState error={usage.error} onRetry={usage.reload} />
      <div className="usage-legend">
        <span>{formatNumber(requests)} requests</span>
        <span>{formatNumber(tokens)} tokens</span>
        <span className="muted">bars: requests per hour, red: errors</span>
      </div>
      <svg className="usage-chart" viewBox={`0 0 ${width} 100`} preserveAspectRatio="none" role="img" aria-label="requests per hour">
        {buckets.map((b, i) => {
          const x = (i / Math.max(1, buckets.length)) * width;
          const w = Math.max(2, width / Math.max(24, buckets.length) - 4);
          const h = (b.requests / peak) * 96;
          const e = (b.errors / peak) * 96;
          return (
            <g key={b.hour}>
              <title>{`${formatDateTime(b.hour)}: ${b.requests} requests, ${b.errors} errors, ${b.prompt_tokens + b.completion_tokens} tokens`}</title>
              <rect className="req" x={x} y={100 - h} width={w} height={h} />
              <rect className="err" x={x} y={100 - e} width={w} height={e} />
            </g>
          );
        })}
      </svg>
    </Card>
  );
}

function RequestDialog({ row, onClose }: { row: RequestLogRow | null; onClose: () => void }) {
  return (
    <Dialog
      title={row ? `${row.endpoint_kind} ${row.alias} · ${row.status}` : ""}
      open={row !== null}
      onClose={onClose}
      testId="request-dialog"
      wide
      footer={
        <button type="button" className="btn" onClick={onClose}>
          Close
        </button>
      }
    >
      {row && (
        <>
          <dl className="kv">
            <dt>Request id</dt>
            <dd><code>{row.request_id}</code></dd>
            <dt>When</dt>
            <dd>{formatDateTime(row.created_at)}</dd>
            <dt>Tenant / key</dt>
            <dd>{row.tenant_name} / <code>{row.key_prefix}…</code></dd>
            <dt>Upstream</dt>
            <dd>{row.deployment_id !== null ? `deployment #${row.deployment_id} ` : ""}{row.upstream || "—"}</dd>
            <dt>Model version</dt>
            <dd>{row.model_version_id !== null ? `#${row.model_version_id}` : "—"}</dd>
            <dt>Route</dt>
            <dd>{row.route_pool} — {row.route_reason || "—"}</dd>
            <dt>Stages</dt>
            <dd data-testid="request-stages">
              {row.stages?.length ? (
                <ul className="stage-list">
                  {row.stages.map((s) => (
                    <li key={s.name}>{stageText(s)}</li>
                  ))}
                </ul>
              ) : (
                "— (no chain)"
              )}
            </dd>
            <dt>Retries</dt>
            <dd>{row.retries}</dd>
            <dt>Priority / stream</dt>
            <dd>{row.priority} / {row.stream ? "yes" : "no"}</dd>
            <dt>Tokens</dt>
            <dd>
              {formatNumber(row.prompt_tokens, "—")} prompt{row.prompt_tokens_estimated ? " (estimated)" : ""}, {formatNumber(row.completion_tokens, "—")} completion
            </dd>
            <dt>TTFT / latency</dt>
            <dd>{ms(row.ttft_ms)} / {ms(row.latency_ms)}</dd>
            <dt>Error</dt>
            <dd>{row.error_type || "—"}</dd>
          </dl>
          {row.prompt_text !== null && (
            <div className="grid-2">
              <div>
                <h2>Prompt</h2>
                <pre className="json">{row.prompt_text}</pre>
              </div>
              <div>
                <h2>Output</h2>
                <pre className="json">{row.response_text ?? "—"}</pre>
              </div>
            </div>
          )}
        </>
      )}
    </Dialog>
  );
}
