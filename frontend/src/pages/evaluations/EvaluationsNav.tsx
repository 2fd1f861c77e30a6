import { NavLink } from "react-router-dom";

const TABS = [
  { to: "/evaluations", label: "Runs", end: true },
  { to: "/evaluations/suites", label: "Suites", end: false },
];

/** The Evaluations sub-pages, as tabs under the page header (as the registry's). */
export function EvaluationsNav() {
  return (
    <nav aria-label="Evaluations" className="eval-tabs">
      {TABS.map((tab) => (
        <NavLink key={tab.to} to={tab.to} end={tab.end} className={({ isActive }) => (isActive ? "eval-tab eval-tab-active" : "eval-tab")}>
          {tab.label}
        </NavLink>
      ))}
    </nav>
  );
}
