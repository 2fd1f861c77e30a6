// A tenant's request history: requests, success rate, latency and tokens over 15 min, 1 h or 24 h.
import { useState } from "react";
import { Card, ErrorState } from "../../components/Page";
import { RangePicker, type RangeKey } from "../../components/RangePicker";
import { RequestHistory } from "../../components/RequestHistory";
import { useHistory } from "../../hooks/useHistory";

export function TenantHistory({ tenantId }: { tenantId: number }) {
  const [range, setRange] = useState<RangeKey>("1h");
  const subject = `tenant:${tenantId}`;
  const history = useHistory([subject], range);
  return (
    <Card title="History" testId="tenant-history" actions={<RangePicker value={range} onChange={setRange} />}>
      <ErrorState error={history.error} onRetry={history.reload} />
      <RequestHistory history={history.data} subject={subject} breakdown={false} testId="tenant-history" />
    </Card>
  );
}
