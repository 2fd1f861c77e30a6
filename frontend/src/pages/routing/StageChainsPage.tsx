import { Link, useNavigate } from "react-router-dom";
import type { Page as ApiPage, StageChain } from "../../api/types";
import { useAuth } from "../../auth";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { useApi } from "../../hooks/useApi";
import { ChainDiagram } from "./ChainDiagram";
import "./routing.css";

/** Every stage chain: what it applies to, whether it is on, its version and its stages at a glance. */
export function StageChainsPage() {
  const { isAdmin } = useAuth();
  const navigate = useNavigate();
  const chains = useApi<ApiPage<StageChain>>("/api/stage-chains/", { limit: 200, ordering: "name" });
  return (
    <Page
      title="Stage chains"
      subtitle={
        <>
          What a request passes before and after generation, per model alias and/or tenant. <Link to="/routing">Back to routing</Link>
        </>
      }
      actions={
        isAdmin ? (
          <Link className="btn btn-primary" to="/routing/chains/new">
            New chain
          </Link>
        ) : undefined
      }
    >
      <Card testId="chains-card">
        <ErrorState error={chains.error} onRetry={chains.reload} />
        <Table
          testId="chains-table"
          rows={chains.data?.results}
          loading={chains.loading}
          rowKey={(c) => c.id}
          onRowClick={(c) => navigate(`/routing/chains/${c.id}`)}
          empty="No chains: requests go straight to their pool."
          columns={[
            { header: "Chain", cell: (c) => <strong>{c.name}</strong> },
            { header: "Alias", cell: (c) => (c.alias ? <code>{c.alias}</code> : <span className="muted">any</span>) },
            { header: "Tenant", cell: (c) => c.tenant ?? <span className="muted">any</span> },
            { header: "State", cell: (c) => <StatusBadge status={c.enabled ? "enabled" : "disabled"} tone={c.enabled ? "ok" : "off"} /> },
            { header: "Version", cell: (c) => `v${c.version}` },
            { header: "Stages", cell: (c) => <ChainDiagram stages={c.stages} compact testId={`chain-compact-${c.name}`} /> },
          ]}
        />
      </Card>
    </Page>
  );
}
