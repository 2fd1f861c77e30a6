export type BadgeTone = "ok" | "warn" | "bad" | "off" | "info";

/** Common statuses mapped to a tone; pass `tone` for anything else. */
const TONES: Record<string, BadgeTone> = {
  active: "ok",
  running: "ok",
  healthy: "ok",
  ready: "ok",
  online: "ok",
  succeeded: "ok",
  degraded: "warn",
  starting: "warn",
  pending: "warn",
  draining: "warn",
  expired: "off",
  inactive: "off",
  stopped: "off",
  offline: "bad",
  failed: "bad",
  error: "bad",
  revoked: "bad",
};

export function StatusBadge({ status, tone, label }: { status: string; tone?: BadgeTone; label?: string }) {
  const resolved = tone ?? TONES[status.toLowerCase()] ?? "info";
  return (
    <span className={`badge badge-${resolved}`} data-status={status}>
      {label ?? status}
    </span>
  );
}
