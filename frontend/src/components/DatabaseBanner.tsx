// Shown on every page (the login page too) while the API answers 503 `database_unavailable`.
import { useEffect, useState } from "react";
import { api, onDatabaseOutage } from "../api/client";

const RECHECK_MS = 5000;

export function DatabaseBanner() {
  const [down, setDown] = useState(false);
  useEffect(() => onDatabaseOutage(setDown), []);

  // Pages that do not poll would leave the banner up after the database is back: ask again until it is.
  useEffect(() => {
    if (!down) return;
    const timer = window.setInterval(() => {
      api.get("/api/auth/me/").catch(() => undefined);
    }, RECHECK_MS);
    return () => window.clearInterval(timer);
  }, [down]);

  if (!down) return null;
  return (
    <div className="database-banner" role="alert" data-testid="database-banner">
      The database is unavailable: the console cannot read or change anything until it is back. Inference
      through the proxy keeps working. This message goes away by itself once the database answers again.
    </div>
  );
}
