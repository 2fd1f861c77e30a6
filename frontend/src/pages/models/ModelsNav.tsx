import { NavLink } from "react-router-dom";

const TABS = [
  { to: "/models", label: "Versions", end: true },
  { to: "/models/aliases", label: "Aliases", end: false },
  { to: "/models/quantization", label: "Quantization & lineage", end: false },
  { to: "/models/fit", label: "Fit calculator", end: false },
  { to: "/models/stores", label: "Model store", end: false },
];

/** The registry's sub-pages, as tabs under the page header. */
export function ModelsNav() {
  return (
    <nav aria-label="Model registry" style={{ display: "flex", gap: 4, marginBottom: 16, borderBottom: "1px solid var(--border)" }}>
      {TABS.map((tab) => (
        <NavLink
          key={tab.to}
          to={tab.to}
          end={tab.end}
          style={({ isActive }) => ({
            padding: "8px 14px",
            textDecoration: "none",
            color: isActive ? "var(--text)" : "var(--muted)",
            fontWeight: isActive ? 600 : 400,
            borderBottom: isActive ? "2px solid var(--primary)" : "2px solid transparent",
            marginBottom: -1,
          })}
        >
          {tab.label}
        </NavLink>
      ))}
    </nav>
  );
}
