import { useEffect, useState, type FormEvent, type MouseEvent } from "react";
import { Link } from "react-router-dom";
import { Dialog } from "../../components/Dialog";
import { DebouncedInputField, InputField, SelectField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatDateTime, formatNumber, formatTimestamp, isoToZonedInput, zonedInputToIso, zoneLabel, type TimeZoneChoice } from "../../format";
import { useApi, type ApiResource } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";
import "../routing/routing.css";
import type { ApiKey, Page as ApiPage, RequestLogPage, RequestLogRow, RequestLogStage, Tenant, UsageBucket } from "../../api/types";
import { routeSteps } from "./routeReason";

const PAGE_SIZE = 50;
// Tenants and keys offered by the pickers (by name); one beyond these still filters when its id is in the URL.
const TENANT_OPTIONS = 500;
const KEY_OPTIONS = 500;
// The API's filters, kept in the URL. `tz` (how times are shown) is the page's own, not sent.
const FILTERS = ["request_id", "tenant_id", "key_id", "key_prefix", "alias", "status", "status_min", "since", "until", "cursor"] as const;
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

/** A click on a link or button inside a clickable row does its own thing, not open the row. */
function own(event: MouseEvent) {
  event.stopPropagation();
}

/** The cache stage that answered the request from its store, if one did. */
function cacheHit(r: RequestLogRow): string | null {
  const stage = (r.stages ?? []).find((s) => s.kind === "cache" && s.outcome === "hit");
  return stage ? stage.name : null;
}

/** The deployment by name ("#7" once it is deleted). */
function deploymentLabel(r: RequestLogRow): string {
  return r.deployment_name ?? `#${r.deployment_id}`;
}

/** "llama-fast → llama-awq-0 · 1 retry": the pool, the deployment that answered, and the retries it took;
 * "cache hit · answers" for an answer replayed by a chain's cache stage (no pool, no engine). */
function routeText(r: RequestLogRow): string {
  const hit = cacheHit(r);
  if (hit !== null && !r.route_pool) return `cache hit · ${hit}`;
  const target = r.deployment_id !== null ? ` → ${deploymentLabel(r)}` : "";
  const retries = r.retries ? ` · ${r.retries} ${r.retries === 1 ? "retry" : "retries"}` : "";
  return `${r.route_pool || "—"}${target}${retries}`;
}

/** The route cell's tooltip: the whole route, the upstream, why this pool was chosen, the chain's stages. */
function routeTitle(r: RequestLogRow): string {
  return [routeText(r), r.upstream, r.route_reason, ...routeSteps(r.route_reason).map((s) => `· ${s.text}`), ...(r.stages ?? []).map(stageText)].filter(Boolean).join("\n");
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

/** A button that copies `text` (an id, a link); says "Copied" for a moment. */
function CopyButton({ text, label, testId }: { text: string; label: string; testId?: string }) {
  const [copied, setCopied] = useState(false);
  async function copy(event: MouseEvent) {
    event.stopPropagation();
    try {
      await navigator.clipboard.writeText(text);
      setCopied(true);
      window.setTimeout(() => setCopied(false), 1500);
    } catch {
      // No clipboard permission (plain http on another host): the text is on the page to select.
    }
  }
  return (
    <button type="button" className="btn btn-small copy-button" onClick={copy} title={`Copy ${text}`} data-testid={testId}>
      {copied ? "Copied" : label}
    </button>
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

/** The key filter: the keys (of the chosen tenant) by name and visible prefix; the value is the key's id,
 * never the key. A prefix from the URL (a key deleted since) stays selectable. */
function KeyPicker({ keyId, prefix, keys, onChange }: { keyId: string; prefix: string; keys: ApiResource<ApiPage<ApiKey>>; onChange: (changes: Record<string, string>) => void }) {
  const list = keys.data?.results ?? [];
  const options = [
    { value: "", label: keys.loading && !keys.data ? "Loading keys…" : "All keys" },
    ...list.map((k) => ({ value: String(k.id), label: `${k.name} (${k.prefix}…) · ${k.tenant_name}${k.is_active ? "" : ", revoked"}` })),
  ];
  if (keyId && !list.some((k) => String(k.id) === keyId)) options.push({ value: keyId, label: `Key #${keyId}` });
  if (prefix) options.push({ value: `prefix:${prefix}`, label: `Keys ${prefix}…` });
  const value = keyId || (prefix ? `prefix:${prefix}` : "");
  return (
    <SelectField
      label="API key"
      name="key_id"
      options={options}
      value={value}
      onChange={(e) => {
        const v = e.target.value;
        if (v.startsWith("prefix:")) onChange({ key_id: "", key_prefix: v.slice(7) });
        else onChange({ key_id: v, key_prefix: "" });
      }}
      hint={keys.error ? "Could not load keys." : undefined}
    />
  );
}

/** Find one request by the id a client has (the x-request-id header of its answer); other filters are
 * dropped so that they cannot hide it. */
function RequestIdSearch({ value, onFind, errors }: { value: string; onFind: (id: string) => void; errors?: Record<string, string[]> }) {
  const [text, setText] = useState(value);
  useEffect(() => setText(value), [value]);
  function submit(event: FormEvent) {
    event.preventDefault();
    onFind(text.trim());
  }
  return (
    <form className="request-id-search" onSubmit={submit} role="search" data-testid="request-id-search">
      <InputField
        label="Request id"
        name="request_id"
        value={text}
        placeholder="x-request-id of an answer"
        onChange={(e) => setText(e.target.value)}
        errors={errors}
        spellCheck={false}
        autoComplete="off"
      />
      <button type="submit" className="btn btn-primary">
        Find
      </button>
    </form>
  );
}

export function RequestLogPage() {
  // Any change but paging starts again from the newest page (the cursor dropped).
  const { get, update, clear } = useQueryParams("cursor");
  const zone: TimeZoneChoice = get("tz") === "utc" ? "utc" : "local";
  const query: Record<string, string | number> = { page_size: PAGE_SIZE };
  for (const name of FILTERS) query[name] = get(name);
  const rows = useApi<RequestLogPage>("/api/request-log/", query);
  const tenants = useApi<ApiPage<Tenant>>("/api/tenants/", { limit: TENANT_OPTIONS, ordering: "name" });
  const keys = useApi<ApiPage<ApiKey>>("/api/keys/", { limit: KEY_OPTIONS, ordering: "name", tenant: get("tenant_id") });
  const tenantName = tenantLabel(get("tenant_id"), tenants.data?.results);
  const [open, setOpen] = useState<RequestLogRow | null>(null);
  const [generation, setGeneration] = useState(0);
  const outcome = get("status_min") ? `${get("status_min")}+` : get("status");
  const anyFilter = FILTERS.some((name) => name !== "cursor" && get(name));
  const requestId = get("request_id");
  const fieldErrors = rows.error && typeof rows.error === "object" && "fieldErrors" in rows.error ? (rows.error as { fieldErrors: Record<string, string[]> }).fieldErrors : undefined;

  // A search by request id goes straight to the request's details (once per search).
  const [openedFor, setOpenedFor] = useState("");
  const found = rows.data?.results;
  useEffect(() => {
    if (!requestId || requestId === openedFor || !found) return;
    // The rows on screen may still be the previous query's until the search's answer arrives.
    const match = found.find((r) => r.request_id === requestId || requestId.endsWith(`-${r.request_id}`));
    if (match === undefined) return;
    setOpenedFor(requestId);
    setOpen(match);
  }, [requestId, openedFor, found]);

  function setOutcome(value: string) {
    if (value.endsWith("+")) update({ status: "", status_min: value.slice(0, -1) });
    else update({ status: value, status_min: "" });
  }

  function filter(name: string, value: string) {
    update({ [name]: value });
  }

  function findRequest(id: string) {
    const changes: Record<string, string> = {};
    for (const name of FILTERS) changes[name] = "";
    setOpenedFor("");
    update({ ...changes, request_id: id });
    setGeneration((n) => n + 1);
  }

  function filterByKey(row: RequestLogRow) {
    setOpen(null);
    if (row.key_id !== null) update({ key_id: String(row.key_id), key_prefix: "", request_id: "" });
    else update({ key_prefix: row.key_prefix, key_id: "", request_id: "" });
  }

  const zoneText = zoneLabel(zone);
  return (
    <Page title="Request log" subtitle="Every /v1/ request: who, which model and endpoint, outcome, tokens and timings.">
      <UsageCard tenantId={get("tenant_id")} tenantName={tenantName} />
      <RequestIdSearch value={requestId} onFind={findRequest} errors={fieldErrors} />
      <div className="filters" data-testid="request-filters">
        <TenantPicker value={get("tenant_id")} tenants={tenants} onChange={(value) => update({ tenant_id: value, key_id: "" })} />
        <KeyPicker keyId={get("key_id")} prefix={get("key_prefix")} keys={keys} onChange={update} />
        <DebouncedInputField
          key={`alias-${generation}`}
          label="Model alias"
          name="alias"
          value={get("alias")}
          onCommit={(value) => filter("alias", value)}
        />
        <SelectField label="Status" name="outcome" options={OUTCOMES} value={outcome} onChange={(e) => setOutcome(e.target.value)} />
        <InputField label={`From (${zone === "utc" ? "UTC" : "local"})`} name="since" type="datetime-local" step={1} errors={fieldErrors} value={isoToZonedInput(get("since"), zone)} onChange={(e) => filter("since", zonedInputToIso(e.target.value, zone))} />
        <InputField label={`Until (${zone === "utc" ? "UTC" : "local"})`} name="until" type="datetime-local" step={1} errors={fieldErrors} value={isoToZonedInput(get("until"), zone)} onChange={(e) => filter("until", zonedInputToIso(e.target.value, zone))} />
        <SelectField
          label="Times in"
          name="tz"
          options={[
            { value: "local", label: `Local (${zoneLabel("local")})` },
            { value: "utc", label: "UTC" },
          ]}
          value={zone}
          onChange={(e) => update({ tz: e.target.value === "utc" ? "utc" : "", cursor: get("cursor") })}
        />
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
      <ErrorState error={fieldErrors ? null : rows.error} onRetry={rows.reload} />
      <div className="request-log">
        <Table
          testId="request-log-table"
          rows={fieldErrors ? [] : rows.data?.results}
          loading={rows.loading}
          rowKey={(r) => r.id}
          onRowClick={setOpen}
          empty={
            fieldErrors
              ? "Correct the highlighted filter."
              : requestId
                ? `No request with id ${requestId} in the log. The id is the x-request-id header of an answer; rows older than the log's retention are gone.`
                : anyFilter
                  ? "No requests match these filters."
                  : "No requests yet. Call /v1/ with an API key (see the README tour)."
          }
          columns={[
            {
              header: <span title={`Times to the millisecond, ${zoneText}`}>When ({zoneLabel(zone, new Date(), true)})</span>,
              cell: (r) => (
                <span className="mono" title={r.created_at}>
                  {formatTimestamp(r.created_at, zone)}
                </span>
              ),
            },
            { header: "Tenant", cell: (r) => (r.tenant_name ? <Clip text={r.tenant_name} /> : <span className="muted">#{r.tenant_id}</span>) },
            {
              header: "Key",
              cell: (r) =>
                r.key_prefix ? (
                  <button type="button" className="link-button" title={`${r.key_name ? `${r.key_name}: ` : ""}show only this key's requests`} onClick={(e) => { own(e); filterByKey(r); }}>
                    <code>{r.key_prefix}…</code>
                  </button>
                ) : (
                  <span className="muted">—</span>
                ),
            },
            { header: "Model", cell: (r) => <Clip text={r.alias} title={r.model_version_name ? `${r.alias}: ${r.model_version_name}` : r.alias} code /> },
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
              priority: 1,
              cell: (r) => `${formatNumber(r.prompt_tokens, "—")}${r.prompt_tokens_estimated ? "≈" : ""} / ${formatNumber(r.completion_tokens, "—")}`,
            },
            { header: "TTFT", priority: 2, cell: (r) => ms(r.ttft_ms) },
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
      <RequestDialog row={open} zone={zone} onClose={() => setOpen(null)} onFilterKey={filterByKey} />
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
  const refused = buckets.reduce((sum, b) => sum + b.refused, 0);
  const width = 24 * 20;
  // Each bar at its own hour of the last 24 (the API lists only hours with requests): placed by index, two
  // consecutive hours were drawn half the chart apart. The window's last slot is the hour now running.
  const HOUR_MS = 3_600_000;
  const lastHour = Math.floor(Date.now() / HOUR_MS) * HOUR_MS;
  const slot = width / 24;
  const bars = buckets
    .map((b) => ({ b, index: 23 - Math.round((lastHour - Date.parse(b.hour)) / HOUR_MS) }))
    .filter(({ index }) => index >= 0 && index < 24);
  return (
    <Card title={tenantId ? `Usage of tenant ${tenantName}, last 24 hours` : "Usage, last 24 hours (all tenants)"} testId="usage-card">
      <ErrorState error={usage.error} onRetry={usage.reload} />
      <div className="usage-legend">
        <span>{formatNumber(requests)} requests</span>
        <span>{formatNumber(tokens)} tokens</span>
        <span title="Refused or failed before any answer: their tokens are not counted">{formatNumber(refused)} refused</span>
        <span className="muted">bars: requests per hour, red: errors</span>
      </div>
      <svg className="usage-chart" viewBox={`0 0 ${width} 100`} preserveAspectRatio="none" role="img" aria-label="requests per hour">
        {bars.map(({ b, index }) => {
          const x = index * slot + 2;
          const w = slot - 4;
          const h = (b.requests / peak) * 96;
          const e = (b.errors / peak) * 96;
          return (
            <g key={b.hour} data-testid="usage-bar" data-slot={index}>
              <title>{`${formatDateTime(b.hour)}: ${b.requests} requests, ${b.errors} errors (${b.refused} refused), ${b.prompt_tokens + b.completion_tokens} tokens`}</title>
              <rect className="req" x={x} y={100 - h} width={w} height={h} />
              <rect className="err" x={x} y={100 - e} width={w} height={e} />
            </g>
          );
        })}
      </svg>
      <div className="usage-axis muted">
        <span>{formatDateTime(new Date(lastHour - 23 * HOUR_MS).toISOString())}</span>
        <span>{formatDateTime(new Date(lastHour - 11 * HOUR_MS).toISOString())}</span>
        <span>this hour</span>
      </div>
    </Card>
  );
}

function RequestDialog({ row, zone, onClose, onFilterKey }: { row: RequestLogRow | null; zone: TimeZoneChoice; onClose: () => void; onFilterKey: (row: RequestLogRow) => void }) {
  const link = row ? `${window.location.origin}/requests?request_id=${encodeURIComponent(row.request_id)}` : "";
  const steps = row ? routeSteps(row.route_reason) : [];
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
            <dd className="copyable">
              <code data-testid="request-id">{row.request_id || "—"}</code>
              {row.request_id && <CopyButton text={row.request_id} label="Copy id" testId="copy-request-id" />}
              {row.request_id && <CopyButton text={link} label="Copy link" />}
            </dd>
            <dt>When</dt>
            <dd data-testid="request-when">
              {formatTimestamp(row.created_at, zone)} <span className="muted">{zoneLabel(zone, new Date(row.created_at))}</span>
              {zone !== "utc" && <div className="muted mono">{formatTimestamp(row.created_at, "utc")} UTC</div>}
            </dd>
            <dt>Tenant</dt>
            <dd>{row.tenant_id !== null ? <Link to={`/tenants/${row.tenant_id}`}>{row.tenant_name || `#${row.tenant_id}`}</Link> : "—"}</dd>
            <dt>API key</dt>
            <dd data-testid="request-key">
              {row.key_prefix ? (
                <>
                  {row.key_name ? `${row.key_name} ` : ""}
                  <code>{row.key_prefix}…</code>
                  {row.key_id === null && <span className="muted"> (no such key now)</span>}{" "}
                  <button type="button" className="btn btn-small" onClick={() => onFilterKey(row)}>
                    This key's requests
                  </button>
                </>
              ) : (
                "—"
              )}
            </dd>
            <dt>Deployment</dt>
            <dd data-testid="request-deployment">
              {row.deployment_id === null ? (
                "— (no engine saw it)"
              ) : row.deployment_name ? (
                <Link to={`/nodes/deployments/${row.deployment_id}`}>{row.deployment_name}</Link>
              ) : (
                <span>#{row.deployment_id} <span className="muted">(deleted)</span></span>
              )}
              {row.upstream && <div className="muted mono">{row.upstream}</div>}
            </dd>
            <dt>Model version</dt>
            <dd data-testid="request-version">
              {row.model_version_id === null ? (
                "—"
              ) : row.model_version_name ? (
                <Link to={`/models/versions/${row.model_version_id}`}>{row.model_version_name}</Link>
              ) : (
                <span>#{row.model_version_id} <span className="muted">(deleted)</span></span>
              )}
            </dd>
            <dt>Route</dt>
            <dd data-testid="request-route">
              {row.route_pool ? <Link to="/routing">{row.route_pool}</Link> : <span className="muted">no pool</span>}
              {steps.length > 0 && (
                <ol className="route-steps">
                  {steps.map((step, i) => (
                    <li key={i} title={step.raw}>
                      {step.link ? <Link to={step.link}>{step.text}</Link> : step.text}
                    </li>
                  ))}
                </ol>
              )}
              {row.route_reason && <div className="muted mono" title="As the proxy wrote it">{row.route_reason}</div>}
            </dd>
            <dt>Stages</dt>
            <dd data-testid="request-stages">
              {row.stages?.length ? (
                <ol className="stage-list">
                  {row.stages.map((s) => (
                    <li key={s.name} className={`stage-${s.outcome === "blocked" ? "bad" : "ok"}`}>
                      {stageText(s)}
                    </li>
                  ))}
                </ol>
              ) : (
                "— (no chain)"
              )}
            </dd>
            <dt>Retries</dt>
            <dd>{row.retries}</dd>
            <dt>Priority / stream</dt>
            <dd>{row.priority || "—"} / {row.stream ? "yes" : "no"}</dd>
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
