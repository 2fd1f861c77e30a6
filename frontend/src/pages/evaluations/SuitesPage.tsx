import { useState } from "react";
import { useNavigate } from "react-router-dom";
import type { Page as ApiPage, EvalSuite, EvalSuiteVersion } from "../../api/types";
import { useAuth } from "../../auth";
import { DebouncedInputField } from "../../components/Field";
import { ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatShortDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";
import { EvaluationsNav } from "./EvaluationsNav";
import { UploadDialog } from "./UploadDialog";
import "./evaluations.css";

const LIMIT = 25;

/** A version's lock state: locked once a run used it (its cases can no longer change), a draft before. */
export function VersionState({ version }: { version: Pick<EvalSuiteVersion, "locked" | "locked_at"> }) {
  return version.locked ? (
    <StatusBadge status="locked" tone="off" label="locked" />
  ) : (
    <StatusBadge status="draft" tone="warn" label="draft" />
  );
}

/** Evaluation suites: named, versioned sets of cases. Evaluators upload new ones here. */
export function SuitesPage() {
  const { canEvaluate } = useAuth();
  const navigate = useNavigate();
  const { get, set: setParam } = useQueryParams();
  const offset = Number(get("offset")) || 0;
  const search = get("search");
  const [uploading, setUploading] = useState(false);
  const suites = useApi<ApiPage<EvalSuite>>("/api/eval-suites/", { limit: LIMIT, offset, search });

  return (
    <Page
      title="Evaluations"
      subtitle="Suites: the cases a run sends to both models, in numbered versions."
      actions={
        canEvaluate && (
          <button type="button" className="btn btn-primary" onClick={() => setUploading(true)}>
            Upload suite
          </button>
        )
      }
    >
      <EvaluationsNav />
      <div className="filters">
        <DebouncedInputField label="Search" name="search" type="search" placeholder="Name or description" value={search} onCommit={(value) => setParam("search", value)} />
      </div>
      <ErrorState error={suites.error} onRetry={suites.reload} />
      <Table
        testId="suites-table"
        rows={suites.data?.results}
        loading={suites.loading}
        rowKey={(s) => s.id}
        onRowClick={(s) => navigate(`/evaluations/suites/${s.id}`)}
        empty={search ? "No suite matches." : "No suites yet: upload a JSONL file."}
        columns={[
          {
            header: "Suite",
            wrap: true,
            cell: (s) => (
              <>
                <strong>{s.name}</strong>
                {s.description && <div className="muted">{s.description}</div>}
              </>
            ),
          },
          { header: "Latest version", cell: (s) => (s.latest_version ? `v${s.latest_version.number}` : <span className="muted">none</span>) },
          { header: "Cases", className: "num", cell: (s) => s.latest_version?.case_count ?? "—" },
          { header: "State", cell: (s) => (s.latest_version ? <VersionState version={s.latest_version} /> : "—") },
          { header: "Versions", className: "num", cell: (s) => s.version_count },
          { header: "Origin", cell: (s) => (s.builtin ? <StatusBadge status="builtin" tone="info" label="built-in" /> : <span className="muted">uploaded</span>) },
          { header: "Updated", cell: (s) => formatShortDateTime(s.latest_version?.created_at ?? s.updated_at) },
        ]}
        pagination={
          suites.data && suites.data.count > LIMIT ? (
            <Pagination count={suites.data.count} limit={LIMIT} offset={offset} onOffset={(o) => setParam("offset", String(o))} />
          ) : undefined
        }
      />
      <UploadDialog open={uploading} onClose={() => setUploading(false)} onSuite={(suite) => navigate(`/evaluations/suites/${suite.id}`)} />
    </Page>
  );
}
