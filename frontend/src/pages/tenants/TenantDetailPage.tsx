import { Page } from "../../components/Page";
export function TenantDetailPage() {
  return <Page title="Tenant">…</Page>;
}
