// The header badge's number: firing alerts. Fetched on sign-in and every POLL_MS; the live feed's
// `alerts` event (pushed when an alert fires or resolves) updates it at once in between.
import { useCallback, useEffect, useState } from "react";
import { api } from "../api/client";
import type { AlertSummary, AlertsLiveEvent } from "../api/types";
import type { LiveEvent } from "./useLive";

const POLL_MS = 30_000;

export function useAlertCount(): { firing: number | null; onLiveEvent: (event: LiveEvent) => void } {
  const [firing, setFiring] = useState<number | null>(null);

  useEffect(() => {
    let stopped = false;
    const load = () =>
      api
        .get<AlertSummary>("/api/alerts/summary/")
        .then((summary) => !stopped && setFiring(summary.firing))
        .catch(() => undefined); // the badge keeps its last number; the next poll tries again
    void load();
    const timer = window.setInterval(() => void load(), POLL_MS);
    return () => {
      stopped = true;
      window.clearInterval(timer);
    };
  }, []);

  const onLiveEvent = useCallback((event: LiveEvent) => {
    if (event.type !== "alerts") return;
    const { firing: count } = event as Partial<AlertsLiveEvent>;
    if (typeof count === "number") setFiring(count);
  }, []);
  return { firing, onLiveEvent };
}
