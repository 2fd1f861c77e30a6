import { Page } from "../../components/Page";
export function AuditPage() {
  return <Page title="Audit log">…</Page>;
}
