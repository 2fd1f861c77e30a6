import { Page } from "../../components/Page";
export function TenantsPage() {
  return <Page title="Tenants">…</Page>;
}
