import { Page } from "../../components/Page";

/** A navigation target for an area built in a later issue; replace it with the area's real page. */
export function ComingSoon({ area, what }: { area: string; what: string }) {
  return (
    <Page title={area}>
      <div className="notice notice-info" data-testid="coming-soon">
        <strong>Coming in a later issue.</strong> {what}
      </div>
    </Page>
  );
}
