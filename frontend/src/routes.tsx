// The console's one route table. Add a page: create src/pages/<area>/<Name>Page.tsx, import it here, and add
// one entry below; give it `nav` to show it in the sidebar (entries appear in this order).
import type { ReactNode } from "react";
import { AlertsPage } from "./pages/alerts/AlertsPage";
import { AuditPage } from "./pages/audit/AuditPage";
import { DashboardPage } from "./pages/dashboard/DashboardPage";
import { EvalRunPage } from "./pages/evaluations/EvalRunPage";
import { RunsPage } from "./pages/evaluations/RunsPage";
import { SuiteDetailPage } from "./pages/evaluations/SuiteDetailPage";
import { SuitesPage } from "./pages/evaluations/SuitesPage";
import { AliasesPage } from "./pages/models/AliasesPage";
import { FitCalculatorPage } from "./pages/models/FitCalculatorPage";
import { ModelsPage } from "./pages/models/ModelsPage";
import { QuantizationPage } from "./pages/models/QuantizationPage";
import { StoresPage } from "./pages/models/StoresPage";
import { VersionDetailPage } from "./pages/models/VersionDetailPage";
import { DeploymentDetailPage } from "./pages/nodes/DeploymentDetailPage";
import { NodesPage } from "./pages/nodes/NodesPage";
import { PlaygroundPage } from "./pages/playground/PlaygroundPage";
import { RequestLogPage } from "./pages/requests/RequestLogPage";
import { RolloutsPage } from "./pages/rollouts/RolloutsPage";
import { ShadowPairsPage } from "./pages/rollouts/ShadowPairsPage";
import { RoutingPage } from "./pages/routing/RoutingPage";
import { StageChainPage } from "./pages/routing/StageChainPage";
import { StageChainsPage } from "./pages/routing/StageChainsPage";
import { TenantDetailPage } from "./pages/tenants/TenantDetailPage";
import { TenantsPage } from "./pages/tenants/TenantsPage";

export interface ConsoleRoute {
  /** Path under the console root, without the leading slash ("" is the dashboard). */
  path: string;
  element: ReactNode;
  /** Sidebar entry; omit for detail pages reached from a list. */
  nav?: { label: string; section?: string };
}

export const routes: ConsoleRoute[] = [
  { path: "", element: <DashboardPage />, nav: { label: "Dashboard", section: "Overview" } },
  { path: "alerts", element: <AlertsPage />, nav: { label: "Alerts", section: "Overview" } },
  { path: "nodes", element: <NodesPage />, nav: { label: "Nodes", section: "Fleet" } },
  { path: "nodes/deployments/:id", element: <DeploymentDetailPage /> },
  { path: "models", element: <ModelsPage />, nav: { label: "Models", section: "Fleet" } },
  { path: "models/versions/:id", element: <VersionDetailPage /> },
  { path: "models/aliases", element: <AliasesPage /> },
  { path: "models/quantization", element: <QuantizationPage /> },
  { path: "models/fit", element: <FitCalculatorPage /> },
  { path: "models/stores", element: <StoresPage /> },
  { path: "routing", element: <RoutingPage />, nav: { label: "Routing", section: "Fleet" } },
  { path: "routing/chains", element: <StageChainsPage /> },
  { path: "routing/chains/:id", element: <StageChainPage /> },
  { path: "rollouts", element: <RolloutsPage />, nav: { label: "Rollouts", section: "Fleet" } },
  { path: "rollouts/shadow/:alias", element: <ShadowPairsPage /> },
  { path: "playground", element: <PlaygroundPage />, nav: { label: "Playground", section: "Fleet" } },
  { path: "tenants", element: <TenantsPage />, nav: { label: "Tenants", section: "Access" } },
  { path: "tenants/:id", element: <TenantDetailPage /> },
  { path: "evaluations", element: <RunsPage />, nav: { label: "Evaluations", section: "Quality" } },
  { path: "evaluations/suites", element: <SuitesPage /> },
  { path: "evaluations/suites/:id", element: <SuiteDetailPage /> },
  { path: "evaluations/runs/:id", element: <EvalRunPage /> },
  { path: "requests", element: <RequestLogPage />, nav: { label: "Request log", section: "Quality" } },
  { path: "audit", element: <AuditPage />, nav: { label: "Audit", section: "Access" } },
];

/** Sidebar entries grouped by section, in first-appearance order. */
export function navSections(): Array<{ section: string; items: Array<{ label: string; to: string }> }> {
  const sections: Array<{ section: string; items: Array<{ label: string; to: string }> }> = [];
  for (const route of routes) {
    if (!route.nav) continue;
    const name = route.nav.section ?? "";
    let section = sections.find((s) => s.section === name);
    if (!section) {
      section = { section: name, items: [] };
      sections.push(section);
    }
    section.items.push({ label: route.nav.label, to: `/${route.path}` });
  }
  return sections;
}
