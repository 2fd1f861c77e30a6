import { Link, NavLink, Outlet, useNavigate } from "react-router-dom";
import { useAuth } from "../auth";
import { useAlertCount } from "../hooks/useAlertCount";
import { useLive } from "../hooks/useLive";
import { navSections } from "../routes";

/** Sidebar navigation, the signed-in user with their role, and the current page. */
export function Layout() {
  const { me, logout } = useAuth();
  const navigate = useNavigate();
  // Every signed-in page keeps the fleet feed open, so the top bar can say whether live data is flowing.
  const alerts = useAlertCount();
  const live = useLive([], alerts.onLiveEvent);
  return (
    <div className="shell">
      <aside className="sidebar">
        <div className="brand">
          <span className="brand-mark">◆</span> inferchain
        </div>
        <nav aria-label="Main">
          {navSections().map(({ section, items }) => (
            <div className="nav-section" key={section}>
              {section && <div className="nav-section-title">{section}</div>}
              {items.map((item) => (
                <NavLink key={item.to} to={item.to} end={item.to === "/"} className="nav-link">
                  {item.label}
                </NavLink>
              ))}
            </div>
          ))}
        </nav>
        <div className="sidebar-footer">
          <a href="/api/docs/" className="nav-link" target="_blank" rel="noreferrer">
            API docs ↗
          </a>
        </div>
      </aside>
      <div className="main">
        <header className="topbar">
          <span
            className={live.connected ? "live live-on" : "live"}
            data-testid="live-indicator"
            data-connected={live.connected}
            title={live.connected ? "Live updates connected" : "Live updates disconnected; reconnecting"}
          >
            {live.connected ? "Live" : "Offline"}
          </span>
          <Link
            to="/alerts"
            className={alerts.firing ? "alerts-badge alerts-badge-firing" : "alerts-badge"}
            data-testid="alerts-badge"
            data-count={alerts.firing ?? ""}
            title={alerts.firing ? `${alerts.firing} alert${alerts.firing === 1 ? "" : "s"} firing` : "No alert firing"}
          >
            Alerts <span className="alerts-badge-count">{alerts.firing ?? "…"}</span>
          </Link>
          <span className="user" data-testid="current-user">
            <span className="user-name">{me?.username}</span>
            <span className={`role role-${me?.role ?? "none"}`} data-testid="current-role">
              {me?.role}
            </span>
            <button
              type="button"
              className="btn btn-small"
              onClick={() => {
                void logout().then(() => navigate("/login"));
              }}
            >
              Sign out
            </button>
          </span>
        </header>
        <main className="content">
          <Outlet />
        </main>
      </div>
    </div>
  );
}
