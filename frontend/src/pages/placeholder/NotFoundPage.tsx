import { Link } from "react-router-dom";
import { Page } from "../../components/Page";

export function NotFoundPage() {
  return (
    <Page title="Page not found">
      <p>
        There is no console page at this address. <Link to="/">Go to the dashboard</Link>.
      </p>
    </Page>
  );
}
