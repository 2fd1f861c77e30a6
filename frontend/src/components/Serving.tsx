import { Link } from "react-router-dom";
import type { AliasServing, VersionServing } from "../api/types";
import { formatDateTime } from "../format";
import "./serving.css";

// What serves an alias, as the API's one answer (GET /api/routing/serving/) gives it: every page that shows
// it renders this, and none works it out on its own.

/** A share in percent: "64.3%"; "—" for none. */
export function formatShare(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  return `${Number(value.toFixed(1))}%`;
}

const ROLE_WORDS: Record<VersionServing["role"], string> = {
  active: "active",
  candidate: "canary candidate",
  pinned: "pinned by a pool",
  shadow: "shadow (mirrored only)",
  idle: "idle: no route sends it requests",
  retired: "no longer serving",
};

/** "configured 90% / live 64%": the routing's share beside the request log's. */
export function configuredText(s: AliasServing, v: VersionServing): string {
  if (s.configured_mode === "none") return "configured: not routed";
  return v.configured_share === null ? "configured by rule" : `configured ${formatShare(v.configured_share)}`;
}

function liveText(v: VersionServing): string {
  return v.live_share === null ? "live —" : `live ${formatShare(v.live_share)}`;
}

function enginesText(v: { engines_ready: number; engines_total: number; engines_sleeping: number }): string {
  const asleep = v.engines_sleeping ? `, ${v.engines_sleeping} asleep` : "";
  return `${v.engines_ready}/${v.engines_total} engines ready${asleep}`;
}

/** The window the live shares were measured over, in words. */
export function windowText(s: AliasServing): string {
  const requests = s.requests === 1 ? "1 request" : `${s.requests} requests`;
  return `live: last ${s.window_minutes} min, ${requests} sent to an engine`;
}

/** An alias's serving: the live split bar, then one line per version with configured and live share side by
 *  side, engines ready of total and (with `routes`) how requests reach it; the window under it. */
export function ServingSplit({ serving, routes = false }: { serving: AliasServing; routes?: boolean }) {
  const drawn = serving.versions.filter((v) => (v.live_share ?? 0) > 0);
  const quiet = serving.requests === 0;
  return (
    <div className="serving" data-testid="serving" data-alias={serving.alias_name} data-requests={serving.requests} data-window-minutes={serving.window_minutes}>
      <div className="serving-bar" title={quiet ? "No requests in the window" : "Live share of requests"}>
        {drawn.map((v) => (
          <span key={v.version_id} className={`role-${v.role}`} style={{ width: `${v.live_share}%` }} title={`${v.version_label}: live ${formatShare(v.live_share)}`} />
        ))}
      </div>
      <ul className="serving-versions">
        {serving.versions.map((v) => {
          const drift = v.configured_share !== null && v.live_share !== null && Math.abs(v.configured_share - v.live_share) >= 10;
          return (
            <li
              key={v.version_id}
              data-testid="serving-version"
              data-version={v.version_id}
              data-role={v.role}
              data-configured={v.configured_share === null ? "rule" : v.configured_share}
              data-live={v.live_share === null ? "" : v.live_share}
              data-requests={v.requests}
              data-ready={v.engines_ready}
              data-total={v.engines_total}
              title={v.routes.length ? v.routes.join("\n") : "No route sends it requests"}
            >
              <span className={`serving-swatch role-${v.role}`} />
              <strong>{v.version_label}</strong> <span className="muted">{ROLE_WORDS[v.role]}</span>
              <span className="serving-figures">
                {configuredText(serving, v)} /{" "}
                <strong className={drift ? "serving-warn" : undefined} data-testid="serving-live">
                  {liveText(v)}
                </strong>{" "}
                · <span data-testid="serving-engines">{enginesText(v)}</span>
                {v.mirrored_percent !== null && <span className="muted"> · mirrored {formatShare(v.mirrored_percent)}</span>}
              </span>
              {routes && v.routes.length > 0 && <span className="serving-routes muted">{v.routes.join("; ")}</span>}
            </li>
          );
        })}
      </ul>
      <div className="serving-window muted" data-testid="serving-window" title={`${formatDateTime(serving.since)} – ${formatDateTime(serving.until)}`}>
        {windowText(serving)} · {enginesText(serving)} in all
      </div>
    </div>
  );
}

/** Where one version serves: each alias it has a part in (not merely answered for earlier), with its
 *  configured and live share and its engines, from the same answer. */
export function VersionServes({ serving, versionId, compact = false }: { serving: AliasServing[] | undefined; versionId: number; compact?: boolean }) {
  const parts = (serving ?? []).flatMap((s) =>
    s.versions.filter((v) => v.version_id === versionId && v.role !== "retired").map((v) => ({ s, v })),
  );
  if (!serving) return <span className="muted">…</span>;
  if (!parts.length) return <span className="muted">—</span>;
  return (
    <ul className="serves-list" data-testid="version-serves">
      {parts.map(({ s, v }) => (
        <li
          key={s.alias}
          data-testid="version-serves-alias"
          data-alias={s.alias_name}
          data-role={v.role}
          data-configured={v.configured_share === null ? "rule" : v.configured_share}
          data-live={v.live_share === null ? "" : v.live_share}
          data-ready={v.engines_ready}
          data-total={v.engines_total}
          title={`${windowText(s)}\n${v.routes.join("\n")}`}
        >
          <Link to="/models/aliases">
            <code>{s.alias_name}</code>
          </Link>{" "}
          <span className="muted">{v.role}</span>
          {compact ? <br /> : " · "}
          <span className={compact ? "muted" : undefined}>
            {configuredText(s, v)} / {liveText(v)} · {compact ? `${v.engines_ready}/${v.engines_total} ready` : enginesText(v)}
          </span>
        </li>
      ))}
    </ul>
  );
}
