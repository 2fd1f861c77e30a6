import { useState } from "react";
import { Link, useParams } from "react-router-dom";
import { api, errorMessage } from "../../api/client";
import type { Page as ApiPage, EvalCase, EvalSuite, EvalSuiteVersion } from "../../api/types";
import { useAuth } from "../../auth";
import { ConfirmDialog } from "../../components/Dialog";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatShortDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";
import { CaseDialog } from "./CaseDialog";
import { EvaluationsNav } from "./EvaluationsNav";
import { VersionState } from "./SuitesPage";
import { UploadDialog } from "./UploadDialog";
import "./evaluations.css";

const CASES_LIMIT = 50;

/** One suite: its versions (upload a new one, copy a locked one into a draft, export, delete a draft) and
 *  the cases of the version picked (`?version=`, the latest by default), editable while it is a draft. */
export function SuiteDetailPage() {
  const { id } = useParams();
  const { canEvaluate } = useAuth();
  const { get, set: setParam } = useQueryParams();
  const suite = useApi<EvalSuite>(`/api/eval-suites/${id}/`);
  const versions = useApi<ApiPage<EvalSuiteVersion>>("/api/eval-suite-versions/", { suite: id, ordering: "-number", limit: 200 });
  const [uploading, setUploading] = useState(false);
  const [actionError, setActionError] = useState<string | null>(null);
  const [deleting, setDeleting] = useState<EvalSuiteVersion | null>(null);
  const [busy, setBusy] = useState(false);

  const list = versions.data?.results;
  const picked = list?.find((v) => String(v.id) === get("version")) ?? list?.[0];

  const reloadAll = () => {
    suite.reload();
    versions.reload();
  };
  const pick = (version: EvalSuiteVersion) => setParam("version", String(version.id));

  const copy = async (version: EvalSuiteVersion) => {
    setBusy(true);
    setActionError(null);
    try {
      const created = await api.post<EvalSuiteVersion>(`/api/eval-suite-versions/${version.id}/copy/`, {});
      reloadAll();
      pick(created);
    } catch (err) {
      setActionError(errorMessage(err));
    } finally {
      setBusy(false);
    }
  };

  const remove = async () => {
    if (!deleting) return;
    setBusy(true);
    try {
      await api.delete(`/api/eval-suite-versions/${deleting.id}/`);
      setDeleting(null);
      setParam("version", "");
      reloadAll();
    } catch (err) {
      setActionError(errorMessage(err));
      setDeleting(null);
    } finally {
      setBusy(false);
    }
  };

  if (suite.error) {
    return (
      <Page title="Suite" subtitle={<Link to="/evaluations/suites">← Suites</Link>}>
        <ErrorState error={suite.error} onRetry={suite.reload} />
      </Page>
    );
  }
  if (!suite.data) return <Page title="Suite">Loading…</Page>;
  const s = suite.data;

  return (
    <Page
      title={
        <>
          {s.name} {s.builtin && <StatusBadge status="builtin" tone="info" label="built-in" />}
        </>
      }
      subtitle={
        <>
          <Link to="/evaluations/suites">← Suites</Link> {s.description && <span className="muted">· {s.description}</span>}
        </>
      }
      actions={
        canEvaluate && (
          <button type="button" className="btn btn-primary" onClick={() => setUploading(true)}>
            Upload new version
          </button>
        )
      }
    >
      <EvaluationsNav />
      {actionError && (
        <div className="notice notice-bad" role="alert">
          {actionError}
        </div>
      )}
      <Card title="Versions" testId="suite-versions">
        <ErrorState error={versions.error} onRetry={versions.reload} />
        <Table
          testId="versions-table"
          rows={list}
          rowKey={(v) => v.id}
          onRowClick={pick}
          empty="No version yet: upload a JSONL file."
          columns={[
            {
              header: "Version",
              cell: (v) => (
                <span data-testid={`version-${v.number}`}>
                  <strong>v{v.number}</strong> {picked?.id === v.id && <span className="muted">(shown below)</span>}
                </span>
              ),
            },
            { header: "State", cell: (v) => <VersionState version={v} /> },
            { header: "Cases", className: "num", cell: (v) => v.case_count },
            { header: "Note", cell: (v) => v.note || <span className="muted">—</span> },
            { header: "Made by", cell: (v) => v.source },
            { header: "Created", cell: (v) => formatShortDateTime(v.created_at) },
            {
              header: "",
              className: "actions-cell",
              cell: (v) => (
                <span onClick={(e) => e.stopPropagation()}>
                  {canEvaluate && (
                    <Link className="btn btn-small" to={`/evaluations?new=1&suite_version=${v.id}`} title="Start a run of this version (a draft locks)">
                      Run…
                    </Link>
                  )}{" "}
                  <a className="btn btn-small" href={`/api/eval-suite-versions/${v.id}/export/`} download>
                    Export
                  </a>{" "}
                  {canEvaluate && (
                    <button type="button" className="btn btn-small" disabled={busy} onClick={() => void copy(v)} title="A new draft version with the same cases">
                      Copy to draft
                    </button>
                  )}{" "}
                  {canEvaluate && !v.locked && (
                    <button type="button" className="btn btn-small btn-danger" disabled={busy} onClick={() => setDeleting(v)}>
                      Delete
                    </button>
                  )}
                </span>
              ),
            },
          ]}
        />
      </Card>
      {picked && <CasesCard key={picked.id} version={picked} canEdit={canEvaluate && !picked.locked} onChanged={versions.reload} />}
      <UploadDialog
        open={uploading}
        suite={s}
        onClose={() => setUploading(false)}
        onVersion={(version) => {
          reloadAll();
          pick(version);
        }}
      />
      <ConfirmDialog
        title="Delete version"
        open={deleting !== null}
        message={`Delete v${deleting?.number ?? ""} and its ${deleting?.case_count ?? 0} cases? No run has used it.`}
        confirmLabel="Delete version"
        danger
        busy={busy}
        onConfirm={() => void remove()}
        onClose={() => setDeleting(null)}
      />
    </Page>
  );
}

function CasesCard({ version, canEdit, onChanged }: { version: EvalSuiteVersion; canEdit: boolean; onChanged: () => void }) {
  const [offset, setOffset] = useState(0);
  const cases = useApi<ApiPage<EvalCase>>("/api/eval-cases/", { version: version.id, ordering: "position", limit: CASES_LIMIT, offset });
  const [editing, setEditing] = useState<EvalCase | null | undefined>(undefined); // undefined: closed; null: adding
  const [deleting, setDeleting] = useState<EvalCase | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const changed = () => {
    cases.reload();
    onChanged();
  };
  const remove = async () => {
    if (!deleting) return;
    setBusy(true);
    try {
      await api.delete(`/api/eval-cases/${deleting.id}/`);
      setDeleting(null);
      changed();
    } catch (err) {
      setError(errorMessage(err));
    } finally {
      setBusy(false);
    }
  };

  return (
    <Card
      title={`Cases of v${version.number}`}
      testId="suite-cases"
      actions={
        canEdit ? (
          <button type="button" className="btn btn-small btn-primary" onClick={() => setEditing(null)}>
            Add case
          </button>
        ) : (
          version.locked && <span className="muted">Locked: a run has used this version. Copy it into a draft to change its cases.</span>
        )
      }
    >
      <ErrorState error={cases.error} onRetry={cases.reload} />
      <Table
        testId="cases-table"
        rows={cases.data?.results}
        loading={cases.loading}
        rowKey={(c) => c.id}
        empty="This version has no case."
        columns={[
          { header: "Id", cell: (c) => <code>{c.case_id}</code> },
          { header: "Prompt / messages", cell: (c) => <CaseInput value={c} /> },
          { header: "Expected", cell: (c) => (c.expected === null ? <span className="muted">—</span> : <code className="case-text">{c.expected}</code>) },
          { header: "Rule", cell: (c) => c.match_rule ?? <span className="muted">—</span> },
          {
            header: "Tags",
            cell: (c) =>
              c.tags.map((tag) => (
                <span key={tag} className="tag">
                  {tag}
                </span>
              )),
          },
          ...(canEdit
            ? [
                {
                  header: "",
                  className: "actions-cell",
                  cell: (c: EvalCase) => (
                    <>
                      <button type="button" className="btn btn-small" onClick={() => setEditing(c)} aria-label={`Edit ${c.case_id}`}>
                        Edit
                      </button>{" "}
                      <button type="button" className="btn btn-small btn-danger" onClick={() => setDeleting(c)} aria-label={`Delete ${c.case_id}`}>
                        Delete
                      </button>
                    </>
                  ),
                },
              ]
            : []),
        ]}
        pagination={
          cases.data && cases.data.count > CASES_LIMIT ? (
            <Pagination count={cases.data.count} limit={CASES_LIMIT} offset={offset} onOffset={setOffset} />
          ) : undefined
        }
      />
      {editing !== undefined && (
        <CaseDialog key={editing?.id ?? "new"} versionId={version.id} edit={editing} open onClose={() => setEditing(undefined)} onSaved={changed} />
      )}
      <ConfirmDialog
        title="Delete case"
        open={deleting !== null}
        message={`Delete case ${deleting?.case_id ?? ""} from v${version.number}?`}
        confirmLabel="Delete case"
        danger
        busy={busy}
        error={error}
        onConfirm={() => void remove()}
        onClose={() => {
          setDeleting(null);
          setError(null);
        }}
      />
    </Card>
  );
}

/** A case's prompt, or its chat messages one per line with their role. */
function CaseInput({ value }: { value: EvalCase }) {
  if (!value.messages) return <div className="case-text">{value.prompt}</div>;
  return (
    <ul className="case-messages">
      {value.messages.map((m, index) => (
        <li key={index} className="case-text">
          <span className="case-role">{m.role}</span>
          {m.content}
        </li>
      ))}
    </ul>
  );
}
