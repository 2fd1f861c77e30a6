// A route pool's request history on the routing page: pick a pool and a range (15 min, 1 h, 24 h). An alias
// without a policy is routed as a pool of its own name, so aliases that are not pools are listed too.
import { useState } from "react";
import type { Page as ApiPage, ModelAlias, RoutePool } from "../../api/types";
import { Card, ErrorState } from "../../components/Page";
import { RangePicker, type RangeKey } from "../../components/RangePicker";
import { RequestHistory } from "../../components/RequestHistory";
import { useApi } from "../../hooks/useApi";
import { useHistory } from "../../hooks/useHistory";

export function PoolHistory({ pools }: { pools: RoutePool[] }) {
  const [range, setRange] = useState<RangeKey>("1h");
  const [chosen, setChosen] = useState<string | null>(null);
  const aliases = useApi<ApiPage<ModelAlias>>("/api/model-aliases/", { limit: 200 });
  const poolNames = pools.map((p) => p.name);
  const ownPools = (aliases.data?.results ?? []).map((a) => a.name).filter((name) => !poolNames.includes(name));
  const options = [...poolNames.map((name) => ({ name, label: name })), ...ownPools.map((name) => ({ name, label: `${name} (alias, its own pool)` }))];
  const pool = chosen ?? options[0]?.name ?? null;
  const subject = pool === null ? "" : `pool:${pool}`;
  const history = useHistory(pool === null ? [] : [subject], range);
  return (
    <Card
      title="Pool history"
      testId="pool-history"
      actions={
        <>
          {options.length > 0 && (
            <select aria-label="Pool" value={pool ?? ""} onChange={(e) => setChosen(e.target.value)} data-testid="pool-history-pool">
              {options.map((o) => (
                <option key={o.name} value={o.name}>
                  {o.label}
                </option>
              ))}
            </select>
          )}
          <RangePicker value={range} onChange={setRange} />
        </>
      }
    >
      <ErrorState error={history.error} onRetry={history.reload} />
      {pool === null ? (
        <p className="muted">No pools or aliases yet.</p>
      ) : (
        <RequestHistory history={history.data} subject={subject} breakdown testId="pool-history" />
      )}
    </Card>
  );
}
