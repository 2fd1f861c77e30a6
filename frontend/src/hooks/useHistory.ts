// A history card's data: GET /api/history/ for some subjects over a range, refreshed as often as the
// resolution the server picked (every 10 s for 15 min and 1 h, every minute for 24 h).
import { useEffect } from "react";
import type { History } from "../api/types";
import type { RangeKey } from "../components/RangePicker";
import { useApi } from "./useApi";

export function useHistory(subjects: string[], range: RangeKey) {
  const history = useApi<History>(subjects.length ? "/api/history/" : null, { subject: subjects, range });
  const every = (history.data?.resolution_s ?? 10) * 1000;
  const { reload } = history;
  useEffect(() => {
    const timer = window.setInterval(reload, every);
    return () => window.clearInterval(timer);
  }, [every, reload]);
  // A range switch keeps showing the old range until the new one arrives; `data.range` says which it is.
  return history;
}
