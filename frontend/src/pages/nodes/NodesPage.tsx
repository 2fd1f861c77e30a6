import { useState, type ReactNode } from "react";
import { Link, useNavigate } from "react-router-dom";
import { api } from "../../api/client";
import { useAuth } from "../../auth";
import { DebouncedInputField, SelectField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { useQueryParams } from "../../hooks/useQueryParams";
import { DeployWizard } from "./DeployWizard";
import { AddHostDialog, AgentTokenActions, AgentTokenDialog } from "./HostDialogs";
import type { Page as ApiPage, Host } from "../../api/types";
import { useApi } from "../../hooks/useApi";
import "./nodes.css";
import { GpuUtilizationChart } from "./charts";
import { ageSeconds, formatBytes, formatPct } from "../../format";
import { engineLabel, liveFigure } from "./engineKind";
import { useFleet } from "./useFleet";
import { gpuKey } from "./useFleetLive";

// Page sizes: a host card holds its GPUs' charts, so fewer of them than deployment rows.
const HOSTS_LIMIT = 12;
const DEPLOYMENTS_LIMIT = 50;

const HOST_STATES = [
  { value: "", label: "Any state" },
  { value: "down", label: "Down (no recent heartbeat)" },
  { value: "online", label: "Online" },
  { value: "unreachable", label: "Unreachable" },
  { value: "unknown", label: "Never seen" },
  { value: "draining", label: "Draining" },
];

const DEPLOYMENT_STATES = [
  { value: "", label: "Any state" },
  ...["ready", "starting", "degraded", "sleeping", "pending", "verifying", "stopping", "stopped", "failed", "crashed"].map((state) => ({
    value: state,
    label: state,
  })),
];

/** A column header that sorts the list on the server (`?ordering=`): click once ascending, again descending. */
function SortHeader({ label, field, ordering, onOrder }: { label: ReactNode; field: string; ordering: string; onOrder: (o: string) => void }) {
  const active = ordering === field ? "asc" : ordering === `-${field}` ? "desc" : null;
  return (
    <button
      type="button"
      className="btn-link sort-header"
      data-testid={`sort-${field}`}
      aria-sort={active === "asc" ? "ascending" : active === "desc" ? "descending" : "none"}
      onClick={() => onOrder(active === "asc" ? `-${field}` : field)}
    >
      {label} {active === "asc" ? "▲" : active === "desc" ? "▼" : ""}
    </button>
  );
}

/** Hosts with their GPUs and heartbeats, and the deployments on them: both paged, filtered and sorted on the
 * server, with totals, so a fleet of thousands loads a page at a time. Filters live in the URL. */
export function NodesPage() {
  const { isAdmin } = useAuth();
  const navigate = useNavigate();
  const [deploying, setDeploying] = useState(false);
  const [adding, setAdding] = useState(false);
  const [tokenShown, setTokenShown] = useState<Host | null>(null);
  const { get, set, update } = useQueryParams();
  const hostState = get("hstate");
  const hostOffset = Number(get("hoffset")) || 0;
  const offset = Number(get("offset")) || 0;
  const ordering = get("ordering") || "name";
  // The hosts have a pager of their own: a host filter starts it again and leaves the deployments' page.
  const setHostFilter = (name: string, value: string) => update({ [name]: value, hoffset: "", offset: get("offset") });
  const { hosts, deployments, live } = useFleet(
    {
      limit: HOSTS_LIMIT,
      offset: hostOffset,
      search: get("hq"),
      ordering: "name",
      ...(hostState === "down" ? { down: "true" } : { state: hostState }),
    },
    {
      limit: DEPLOYMENTS_LIMIT,
      offset,
      search: get("q"),
      state: get("state"),
      model: get("model"),
      host_name: get("host"),
      ordering,
    },
  );
  // The wizard picks from every host, not the page shown: read when it opens.
  const wizardHosts = useApi<ApiPage<Host>>(deploying ? "/api/hosts/" : null, { limit: 1000, ordering: "name" });
  const sort = (label: ReactNode, field: string) => <SortHeader label={label} field={field} ordering={ordering} onOrder={(o) => set("ordering", o)} />;

  return (
    <Page
      title="Nodes"
      subtitle="Hosts report their GPUs and heartbeat through their agent; deployments run engines on them."
      actions={
        isAdmin && (
          <>
            <button type="button" className="btn" onClick={() => setAdding(true)} data-testid="add-host-button">
              Register a host
            </button>
            <button type="button" className="btn btn-primary" onClick={() => setDeploying(true)} data-testid="deploy-button">
              Deploy a model
            </button>
          </>
        )
      }
    >
      <ErrorState error={hosts.error || deployments.error} onRetry={() => (hosts.reload(), deployments.reload())} />
      <div className="filters" data-testid="host-filters">
        <DebouncedInputField label="Find hosts" name="hq" placeholder="name, address or role" value={get("hq")} onCommit={(v) => setHostFilter("hq", v)} />
        <SelectField label="Host state" name="hstate" options={HOST_STATES} value={hostState} onChange={(e) => setHostFilter("hstate", e.target.value)} />
        {hosts.data && (
          <span className="muted" data-testid="hosts-total">
            {hosts.data.count} {hosts.data.count === 1 ? "host" : "hosts"}
          </span>
        )}
      </div>
      {hosts.data?.results.length === 0 && <p className="muted">{get("hq") || hostState ? "No hosts match these filters." : "No hosts yet: register one."}</p>}
      <div className="host-grid" data-testid="hosts">
        {hosts.data?.results.map((host) => {
          const telemetry = live.hosts[host.name];
          const age = ageSeconds(host.last_heartbeat);
          return (
            <Card
              key={host.id}
              testId={`host-${host.name}`}
              actions={
                isAdmin && (
                  <>
                    <button
                      type="button"
                      className="btn btn-small"
                      title={host.state === "draining" ? "Accept new deployments again" : "Accept no new deployments; running engines keep serving"}
                      onClick={() => api.post(`/api/hosts/${host.id}/${host.state === "draining" ? "undrain" : "drain"}/`, {}).then(hosts.reload)}
                    >
                      {host.state === "draining" ? "Undrain" : "Drain"}
                    </button>
                    <AgentTokenActions host={host} onRotated={setTokenShown} onChanged={hosts.reload} />
                  </>
                )
              }
              title={
                <>
                  {host.name}{" "}
                  <StatusBadge
                    status={host.state === "draining" ? "draining" : host.reachable ? "online" : host.state === "unknown" ? "unknown" : "unreachable"}
                    tone={host.state === "draining" ? "warn" : host.reachable ? "ok" : "bad"}
                  />
                </>
              }
            >
              <div className="muted">
                {host.address} · {host.role || "no role"} · {host.agent_queue}
              </div>
              <div className="muted" data-testid={`agent-token-${host.name}`}>
                Agent token:{" "}
                {host.agent_token ? (
                  <>
                    <code>{host.agent_token.prefix}…</code>
                    {host.agent_token.last_used_at ? ` · used ${new Date(host.agent_token.last_used_at).toLocaleString()}` : " · not used yet"}
                  </>
                ) : (
                  "none (its agent is refused)"
                )}
              </div>
              <div className="muted">
                Heartbeat: {age === null ? "never" : `${age.toFixed(0)} s ago`}
                {host.agent_info.gpu_note && <> · {host.agent_info.gpu_note}</>}
              </div>
              {host.gpus.length === 0 && <p className="muted">No GPUs (CPU node).</p>}
              {host.gpus.map((gpu) => {
                const sample = telemetry?.gpus.find((g) => g.index === gpu.index) ?? gpu.live;
                const key = `${host.name}:${gpu.index}`;
                return (
                  <div key={gpu.id} className="gpu-tile" data-testid={`host-gpu-${key}`}>
                    <div>
                      GPU {gpu.index}: {gpu.name} {gpu.simulated && <StatusBadge status="simulated" tone="info" />}
                    </div>
                    <div className="muted">
                      {sample
                        ? `${sample.utilization_pct.toFixed(0)}% · ${formatBytes(sample.memory_used_bytes)} / ${formatBytes(gpu.memory_total_bytes)} · ${sample.temperature_c.toFixed(0)} °C`
                        : `${formatBytes(gpu.memory_total_bytes)} · no live sample`}
                    </div>
                    <GpuUtilizationChart series={live.series.gpus[gpuKey(host.name, gpu)]} testId={`host-gpu-util-${key}`} />
                  </div>
                );
              })}
            </Card>
          );
        })}
      </div>
      {hosts.data && hosts.data.count > HOSTS_LIMIT && (
        <div data-testid="hosts-pagination">
          <Pagination count={hosts.data.count} limit={HOSTS_LIMIT} offset={hostOffset} onOffset={(o) => set("hoffset", o ? String(o) : "")} />
        </div>
      )}
      <div style={{ height: 16 }} />
      <Card title="Deployments" testId="deployments-card">
        <div className="filters" data-testid="deployment-filters">
          <DebouncedInputField label="Find deployments" name="q" placeholder="name, served name, host or model" value={get("q")} onCommit={(v) => set("q", v)} />
          <SelectField label="State" name="state" options={DEPLOYMENT_STATES} value={get("state")} onChange={(e) => set("state", e.target.value)} />
          <DebouncedInputField label="Model" name="model" placeholder="model name" value={get("model")} onCommit={(v) => set("model", v)} />
          <DebouncedInputField label="Host" name="host" placeholder="host name" value={get("host")} onCommit={(v) => set("host", v)} />
        </div>
        <Table
          testId="deployments-table"
          rows={deployments.data?.results}
          loading={deployments.loading}
          rowKey={(d) => d.id}
          onRowClick={(d) => navigate(`/nodes/deployments/${d.id}`)}
          empty={get("q") || get("state") || get("model") || get("host") ? "No deployments match these filters." : "No deployments yet."}
          pagination={
            deployments.data && (
              <div data-testid="deployments-pagination">
                <Pagination count={deployments.data.count} limit={DEPLOYMENTS_LIMIT} offset={offset} onOffset={(o) => set("offset", o ? String(o) : "")} />
              </div>
            )
          }
          columns={[
            { header: sort("Name", "name"), cell: (d) => <Link to={`/nodes/deployments/${d.id}`}>{d.name}</Link> },
            { header: "Model", wrap: true, cell: (d) => d.model_version_label },
            { header: sort("Serves as", "served_model_name"), cell: (d) => <code>{d.served_model_name}</code> },
            { header: sort("Engine", "engine"), cell: (d) => engineLabel(d.engine) },
            { header: sort("Host", "host__name"), wrap: true, cell: (d) => `${d.host_name}${d.gpu_indices.length ? ` · GPU ${d.gpu_indices.join(",")}` : " · CPU"}` },
            { header: sort("Port", "port"), label: "Port", className: "num", priority: 2, cell: (d) => d.port },
            {
              header: sort("State", "state"),
              wrap: true,
              cell: (d) => (
                <span data-testid={`deployment-state-${d.id}`}>
                  <StatusBadge status={live.engines[d.id]?.state ?? d.state} />
                  {d.state === "sleeping" && (
                    <span className="muted" data-testid={`freed-${d.id}`}>
                      {" "}
                      level {d.sleeping_level} · {formatBytes(d.freed_memory_bytes)} freed
                    </span>
                  )}
                </span>
              ),
            },
            {
              header: <span title="Restarts after a crash over the deployment's life (in a row now)">Restarts</span>,
              label: "Restarts",
              className: "num",
              priority: 1,
              cell: (d) => (
                <span data-testid={`restarts-${d.id}`}>
                  {d.restarts_total}
                  {d.restart_count > 0 && <span className="muted"> ({d.restart_count} in a row)</span>}
                </span>
              ),
            },
            {
              header: "KV cache",
              className: "num",
              cell: (d) => <span data-testid={`kv-${d.id}`}>{liveFigure(live.engines[d.id] ?? d.live, (e) => e.kv_cache_usage_perc, formatPct)}</span>,
            },
            { header: "Tokens/s", className: "num", cell: (d) => liveFigure(live.engines[d.id] ?? d.live, (e) => e.tokens_per_s, (v) => (v ?? 0).toFixed(0)) },
          ]}
        />
      </Card>
      <AddHostDialog
        open={adding}
        onClose={() => setAdding(false)}
        onCreated={(host) => {
          setAdding(false);
          setTokenShown(host);
          hosts.reload();
        }}
      />
      <AgentTokenDialog host={tokenShown} onClose={() => setTokenShown(null)} />
      {deploying && (
        <DeployWizard
          hosts={wizardHosts.data?.results ?? []}
          onClose={() => setDeploying(false)}
          onCreated={(d) => navigate(`/nodes/deployments/${d.id}`)}
        />
      )}
    </Page>
  );
}
