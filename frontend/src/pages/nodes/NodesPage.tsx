import { useState } from "react";
import { Link, useNavigate } from "react-router-dom";
import { api } from "../../api/client";
import { useAuth } from "../../auth";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { DeployWizard } from "./DeployWizard";
import { AddHostDialog, AgentTokenActions, AgentTokenDialog } from "./HostDialogs";
import type { Host } from "../../api/types";
import "./nodes.css";
import { GpuUtilizationChart } from "./charts";
import { ageSeconds, formatBytes, formatPct } from "../../format";
import { useFleet } from "./useFleet";
import { gpuKey } from "./useFleetLive";

/** Hosts with their GPUs and heartbeats, and every deployment on them. */
export function NodesPage() {
  const { isAdmin } = useAuth();
  const navigate = useNavigate();
  const [deploying, setDeploying] = useState(false);
  const [adding, setAdding] = useState(false);
  const [tokenShown, setTokenShown] = useState<Host | null>(null);
  const { hosts, deployments, live } = useFleet();

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
      <div style={{ height: 16 }} />
      <Card title="Deployments" testId="deployments-card">
        <Table
          testId="deployments-table"
          rows={deployments.data?.results}
          loading={deployments.loading}
          rowKey={(d) => d.id}
          onRowClick={(d) => navigate(`/nodes/deployments/${d.id}`)}
          empty="No deployments yet."
          columns={[
            { header: "Name", cell: (d) => <Link to={`/nodes/deployments/${d.id}`}>{d.name}</Link> },
            { header: "Model", cell: (d) => d.model_version_label },
            { header: "Serves as", cell: (d) => <code>{d.served_model_name}</code> },
            { header: "Engine", cell: (d) => d.engine },
            { header: "Host", cell: (d) => `${d.host_name}${d.gpu_indices.length ? ` · GPU ${d.gpu_indices.join(",")}` : " · CPU"}` },
            { header: "Port", className: "num", cell: (d) => d.port },
            {
              header: "State",
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
              className: "num",
              cell: (d) => (
                <span data-testid={`restarts-${d.id}`}>
                  {d.restarts_total}
                  {d.restart_count > 0 && <span className="muted"> ({d.restart_count} in a row)</span>}
                </span>
              ),
            },
            { header: "KV cache", className: "num", cell: (d) => formatPct(live.engines[d.id]?.kv_cache_usage_perc) },
            { header: "Tokens/s", className: "num", cell: (d) => live.engines[d.id]?.tokens_per_s.toFixed(0) ?? "—" },
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
          hosts={hosts.data?.results ?? []}
          onClose={() => setDeploying(false)}
          onCreated={(d) => navigate(`/nodes/deployments/${d.id}`)}
        />
      )}
    </Page>
  );
}
