import type { DeploymentCost, DeploymentCostList, PoolCostList, TenantUsage, TenantUsageList } from "../api/types";
import { formatNumber, formatPct } from "../format";
import { useApi } from "../hooks/useApi";
import { Card, ErrorState } from "./Page";
import { Table } from "./Table";

// Cost figures over the last 24 hours (GET /api/routing/cost/...; docs/monitoring.md "Cost").
export const COST_WINDOW_HOURS = 24;

/** Dollars with cents; small amounts keep four decimals so a cheap hour does not read as $0.00. */
export function formatMoney(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  return Math.abs(value) < 1 && value !== 0 ? `$${value.toFixed(4)}` : `$${value.toFixed(2)}`;
}

export function formatPerMillion(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : `${formatMoney(value)} / M tokens`;
}

/** A deployment's share of its host's cost and its cost per million output tokens. */
export function DeploymentCostCard({ deploymentId }: { deploymentId: string }) {
  const cost = useApi<DeploymentCostList>("/api/routing/cost/deployments/", {
    hours: COST_WINDOW_HOURS,
    deployment_id: deploymentId,
  });
  const row: DeploymentCost | undefined = cost.data?.results[0];
  return (
    <Card title={`Cost (last ${COST_WINDOW_HOURS} h)`} testId="deployment-cost">
      <ErrorState error={cost.error} onRetry={cost.reload} />
      {cost.data && !row && <p className="muted">Not running in the window: no cost.</p>}
      {row && (
        <>
          <div>
            <strong data-testid="deployment-cost-per-million">{formatPerMillion(row.cost_per_million_output_tokens)}</strong>{" "}
            <span className="muted">output</span>
          </div>
          <div className="muted">
            <span data-testid="deployment-cost-total">{formatMoney(row.cost)}</span> over {row.running_hours.toFixed(1)} h ·{" "}
            {formatNumber(row.output_tokens)} output tokens · {row.host_gpus ? `${row.gpus_held} of ${row.host_gpus} GPUs` : "whole host"} of{" "}
            {row.host} at {formatMoney(row.host_cost_per_hour)}/h
          </div>
        </>
      )}
    </Card>
  );
}

/** Every pool's cost and cost per million output tokens. */
export function PoolCostCard() {
  const cost = useApi<PoolCostList>("/api/routing/cost/pools/", { hours: COST_WINDOW_HOURS });
  return (
    <Card title={`Cost per pool (last ${COST_WINDOW_HOURS} h)`} testId="pool-cost-card">
      <ErrorState error={cost.error} onRetry={cost.reload} />
      <Table
        testId="pool-cost-table"
        rows={cost.data?.results}
        loading={cost.data === undefined && !cost.error}
        rowKey={(p) => p.pool}
        empty="No pools."
        columns={[
          {
            header: "Pool",
            cell: (p) => (
              <>
                <strong>{p.pool}</strong>
                {p.implicit && (
                  <span className="muted" title="The proxy's own pool for an alias without pools">
                    {" "}
                    (implicit)
                  </span>
                )}
              </>
            ),
          },
          { header: "Deployments", cell: (p) => p.deployments.join(", ") || <span className="muted">none</span> },
          { header: "Cost", cell: (p) => formatMoney(p.cost) },
          { header: "Output tokens", cell: (p) => formatNumber(p.output_tokens) },
          { header: "Per million output tokens", cell: (p) => formatMoney(p.cost_per_million_output_tokens) },
        ]}
      />
    </Card>
  );
}

/** A tenant's usage against its daily budget, and its spend by pool. */
export function TenantUsageCard({ tenantId }: { tenantId: number }) {
  const usage = useApi<TenantUsageList>("/api/routing/cost/tenants/", { hours: COST_WINDOW_HOURS, tenant_id: tenantId });
  const row: TenantUsage | undefined = usage.data?.results[0];
  return (
    <Card title={`Usage and spend (last ${COST_WINDOW_HOURS} h)`} testId="tenant-usage">
      <ErrorState error={usage.error} onRetry={usage.reload} />
      {row && (
        <>
          <div data-testid="tenant-admitted">
            spend <strong data-testid="tenant-spend">{formatMoney(row.spend)}</strong> · {formatNumber(row.requests)} requests ·{" "}
            {formatNumber(row.prompt_tokens)} prompt and {formatNumber(row.output_tokens)} output tokens
            {row.unpriced_output_tokens > 0 && <span className="muted"> ({formatNumber(row.unpriced_output_tokens)} unpriced: no pool)</span>}
          </div>
          {/* Refused and failed requests got no answer: counted apart, never in the usage or the spend above. */}
          <div className="muted" data-testid="tenant-refused">
            not counted: {formatNumber(row.refused_requests)} refused (scope, quota, rate limit, context checks; {formatNumber(row.refused_prompt_tokens)}{" "}
            prompt tokens) · {formatNumber(row.failed_requests)} failed before an answer
          </div>
          <div data-testid="tenant-budget-used">
            today:{" "}
            {row.daily_token_budget === null ? (
              <>{formatNumber(row.daily_tokens_used)} tokens, no daily budget</>
            ) : (
              <>
                {formatNumber(row.daily_tokens_used)} of {formatNumber(row.daily_token_budget)} tokens ({formatPct(row.daily_budget_used_ratio)} of the daily
                budget)
              </>
            )}
          </div>
          {row.by_pool.length > 0 && (
            <Table
              testId="tenant-spend-by-pool"
              rows={row.by_pool}
              rowKey={(s) => s.pool}
              columns={[
                { header: "Pool", cell: (s) => s.pool },
                { header: "Output tokens", cell: (s) => formatNumber(s.output_tokens) },
                { header: "Spend", cell: (s) => formatMoney(s.spend) },
              ]}
            />
          )}
        </>
      )}
    </Card>
  );
}
