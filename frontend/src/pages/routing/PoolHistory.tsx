// A route pool's request history on the routing page: pick a pool and a range (15 min, 1 h, 24 h).
import { useState } from "react";
import type { RoutePool } from "../../api/types";
import { Card, ErrorState } from "../../components/Page";
import { RangePicker, type RangeKey } from "../../components/RangePicker";
import { RequestHistory } from "../../components/RequestHistory";
import { useHistory } from "../../hooks/useHistory";

export function PoolHistory({ pools }: { pools: RoutePool[] }) {
  const [range, setRange] = useState<RangeKey>("1h");
  const [chosen, setChosen] = useState<string | null>(null);
  const pool = chosen ?? pools[0]?.name ?? null;
  const subject = pool === null ? "" : `pool:${pool}`;
  const history = useHistory(pool === null ? [] : [subject], range);
  return (
    <Card
      title="Pool history"
      testId="pool-history"
      actions={
        <>
          {pools.length > 0 && (
            <select aria-label="Pool" value={pool ?? ""} onChange={(e) => setChosen(e.target.value)} data-testid="pool-history-pool">
              {pools.map((p) => (
                <option key={p.id} value={p.name}>
                  {p.name}
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
        <p className="muted">No pools yet.</p>
      ) : (
        <RequestHistory history={history.data} subject={subject} breakdown testId="pool-history" />
      )}
    </Card>
  );
}
