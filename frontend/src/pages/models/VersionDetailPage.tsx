import { useEffect, useState, type FormEvent } from "react";
import { Link, useNavigate, useParams } from "react-router-dom";
import { api, ApiError, errorMessage } from "../../api/client";
import type { AliasServing, Page as ApiPage, EvalVerdictPage, ManifestFile, ModelVersion, VerificationRun } from "../../api/types";
import { useAuth } from "../../auth";
import { ConfirmDialog } from "../../components/Dialog";
import { FormErrors, InputField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { VersionServes } from "../../components/Serving";
import { StatusBadge } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatBytes, formatDateTime, formatNumber, formatParams } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useLive } from "../../hooks/useLive";
import { ProblemsTable } from "./ProblemsTable";

const FILES_LIMIT = 50;
const HISTORY_LIMIT = 20;

/** One version: its facts, its manifest with hashes, and where it verified (or failed) on each host. */
export function VersionDetailPage() {
  const { id } = useParams();
  const { isAdmin } = useAuth();
  const navigate = useNavigate();
  const version = useApi<ModelVersion>(`/api/model-versions/${id}/`);
  const serving = useApi<AliasServing[]>("/api/routing/serving/");
  const [deleting, setDeleting] = useState(false);
  const [deleteError, setDeleteError] = useState<string | null>(null);
  // A verification finishing on any host (the agent's task) refreshes the state, hosts and history.
  const [generation, setGeneration] = useState(0);
  const reloadVersion = version.reload;
  const live = useLive(id ? [`live.model_version.${id}`] : [], (event) => {
    if (event.type !== "verification") return;
    reloadVersion();
    setGeneration((n) => n + 1);
  });

  if (version.error) {
    return (
      <Page title="Model version" subtitle={<Link to="/models">← Models</Link>}>
        <ErrorState error={version.error} onRetry={version.reload} />
      </Page>
    );
  }
  if (!version.data) return <Page title="Model version">Loading…</Page>;
  const v = version.data;

  const remove = async () => {
    try {
      await api.delete(`/api/model-versions/${v.id}/`);
      navigate("/models");
    } catch (err) {
      setDeleteError(errorMessage(err));
    }
  };

  return (
    <Page
      title={
        <>
          {v.model_name}@{v.revision} <StatusBadge status={v.state} tone={v.state === "verified" ? "ok" : undefined} />
        </>
      }
      subtitle={
        <>
          <Link to="/models">← Models</Link>{" "}
          <span className="muted" data-testid="version-live" data-connected={live.connected ? "true" : "false"}>
            {live.connected ? "· updates live" : "· not live: reload to refresh"}
          </span>
        </>
      }
      actions={
        <>
          <Link className="btn" to={`/models/fit?version=${v.id}`}>
            Will it fit?
          </Link>
          {isAdmin && (
            <button type="button" className="btn btn-danger" onClick={() => setDeleting(true)}>
              Delete version
            </button>
          )}
        </>
      }
    >
      <div className="grid-2">
        <Card title="Version" testId="version-props">
          <dl className="props">
            <dt>Source</dt>
            <dd>
              <code style={{ wordBreak: "break-all" }}>{v.source_path}</code> ({v.source_kind})
            </dd>
            <dt>Manifest digest</dt>
            <dd>
              <code data-testid="manifest-digest" style={{ wordBreak: "break-all" }}>{v.manifest_digest}</code>
            </dd>
            <dt>Files</dt>
            <dd>
              {v.file_count} · {formatBytes(v.total_bytes)}
            </dd>
            <dt>Parameters</dt>
            <dd>{formatParams(v.parameter_count)}</dd>
            <dt>Max context</dt>
            <dd>{formatNumber(v.max_context, "—")}</dd>
            <dt>Tokenizer</dt>
            <dd>{v.tokenizer_path ? <code style={{ wordBreak: "break-all" }}>{v.tokenizer_path}</code> : <span className="muted">—</span>}</dd>
            <dt>Quantization</dt>
            <dd>{v.quantization_name ?? <span className="muted">none</span>}</dd>
            <dt>Quantized from</dt>
            <dd>{v.parent ? <Link to={`/models/versions/${v.parent}`}>{v.parent_label}</Link> : <span className="muted">— (full precision)</span>}</dd>
            <dt>Serves</dt>
            <dd>
              <VersionServes serving={serving.data} versionId={v.id} />
            </dd>
            <dt>Registered</dt>
            <dd>{formatDateTime(v.created_at)}</dd>
          </dl>
        </Card>
        <Card title="Architecture" testId="version-architecture">
          <dl className="props">
            {Object.entries(v.architecture)
              .filter(([, value]) => typeof value !== "object" || value === null)
              .map(([name, value]) => (
                <Fragmentless key={name} name={name} value={value} />
              ))}
          </dl>
        </Card>
      </div>
      {v.provenance.produced && <ProducedCard version={v} />}
      <VerdictsCard version={v} />
      <HostsCard version={v} editable={isAdmin} onQueued={version.reload} refresh={generation} />
      <ManifestCard version={v} />
      <HistoryCard version={v} refresh={generation} />
      <ConfirmDialog
        open={deleting}
        title={`Delete ${v.model_name}@${v.revision}?`}
        message="Its manifest and verification history go with it. Versions in use by an alias, a deployment or a quantized child cannot be deleted."
        confirmLabel="Delete version"
        danger
        error={deleteError}
        onConfirm={() => void remove()}
        onClose={() => {
          setDeleting(false);
          setDeleteError(null);
        }}
      />
    </Page>
  );
}

function Fragmentless({ name, value }: { name: string; value: unknown }) {
  return (
    <>
      <dt style={{ overflowWrap: "anywhere" }}>{name}</dt>
      <dd>
        <code>{typeof value === "number" ? value.toLocaleString() : String(value)}</code>
      </dd>
    </>
  );
}

function HostsCard({ version, editable, onQueued, refresh }: { version: ModelVersion; editable: boolean; onQueued: () => void; refresh: number }) {
  const hosts = useApi<VerificationRun[]>(`/api/model-versions/${version.id}/hosts/`);
  const reloadHosts = hosts.reload;
  useEffect(() => {
    if (refresh) reloadHosts();
  }, [refresh, reloadHosts]);
  const [hostName, setHostName] = useState("");
  const [error, setError] = useState<Error | null>(null);
  const [queued, setQueued] = useState<string | null>(null);

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setError(null);
    setQueued(null);
    try {
      await api.post(`/api/model-versions/${version.id}/verify/`, { host_name: hostName });
      setQueued(hostName);
      onQueued();
      hosts.reload();
    } catch (err) {
      setError(err instanceof Error ? err : new Error(String(err)));
    }
  };
  return (
    <Card title="Verified on hosts" testId="version-hosts">
      <p className="muted" style={{ marginTop: 0 }}>
        The latest verification per host. A deployment starts on a host only where its latest run passed.
      </p>
      <ErrorState error={hosts.error} onRetry={hosts.reload} />
      <Table
        rows={hosts.data}
        loading={hosts.loading}
        rowKey={(r) => r.id}
        empty="Not verified on any host yet."
        columns={[
          { header: "Host", cell: (r) => <strong>{r.host_name}</strong> },
          { header: "Result", cell: (r) => <StatusBadge status={r.ok ? "verified" : "failed"} tone={r.ok ? "ok" : "bad"} /> },
          { header: "Bad files", className: "num", cell: (r) => r.problems.length },
          { header: "Cache hits", className: "num", cell: (r) => `${r.cache_hits} / ${r.files_checked}` },
          { header: "Why", cell: (r) => r.trigger },
          { header: "Finished", cell: (r) => formatDateTime(r.finished_at) },
        ]}
      />
      {editable && (
        <form onSubmit={submit} noValidate className="filters" style={{ marginTop: 16, marginBottom: 0 }}>
          <InputField label="Verify on host" name="host_name" value={hostName} onChange={(e) => setHostName(e.target.value)} errors={error instanceof ApiError ? error.fieldErrors : undefined} placeholder="node name" />
          <button type="submit" className="btn">
            Queue verification
          </button>
          {queued && <span className="saved">Queued on node.{queued}.</span>}
        </form>
      )}
      <FormErrors error={error} fields={["host_name"]} />
    </Card>
  );
}

/** What the quantize action actually wrote: tensor types by weight share and bits per weight, and a warning
 *  when llama.cpp fell back from the requested type for most weights. */
function ProducedCard({ version }: { version: ModelVersion }) {
  const prov = version.provenance;
  const produced = prov.produced;
  if (!produced) return null;
  return (
    <Card title="What the quantizer wrote" testId="version-produced">
      {produced.warning && (
        <div className="form-error" role="alert" data-testid="produced-warning">
          {produced.warning}
        </div>
      )}
      <p className="muted" style={{ marginTop: 0 }}>
        Asked for {prov.target_type} with {prov.tool} (llama.cpp {prov.llama_cpp}) from {prov.source_file}:{" "}
        <strong data-testid="produced-bpw">{produced.bits_per_weight} bits per weight</strong>
        {produced.requested && (
          <>
            {" "}
            ({produced.requested.tensor_type} alone is {produced.requested.nominal_bits_per_weight}; {Math.round(produced.requested.share * 100)} % of the weights are{" "}
            {produced.requested.tensor_type})
          </>
        )}
        .
      </p>
      <Table
        rows={produced.tensor_types}
        rowKey={(r) => r.type}
        empty="No tensors."
        columns={[
          { header: "Tensor type", cell: (r) => r.type },
          { header: "Tensors", className: "num", cell: (r) => formatNumber(r.tensors) },
          { header: "Weights", className: "num", cell: (r) => `${Math.round(r.share * 1000) / 10} %` },
          { header: "Bits per weight", className: "num", cell: (r) => r.bits_per_weight },
          { header: "Size", className: "num", cell: (r) => formatBytes(r.bytes) },
        ]}
      />
    </Card>
  );
}

/** Evaluation verdicts signed on runs whose candidate was this version (the current one of each run first). */
function VerdictsCard({ version }: { version: ModelVersion }) {
  const [offset, setOffset] = useState(0);
  const verdicts = useApi<EvalVerdictPage>(`/api/model-versions/${version.id}/verdicts/`, { limit: HISTORY_LIMIT, offset });
  return (
    <Card title="Evaluation verdicts" testId="version-verdicts">
      <p className="muted" style={{ marginTop: 0 }}>
        Sign-offs of evaluation runs with this version as the candidate. A later verdict on the same run supersedes the earlier one.
      </p>
      <ErrorState error={verdicts.error} onRetry={verdicts.reload} />
      <Table
        rows={verdicts.data?.results}
        loading={verdicts.loading}
        rowKey={(r) => r.id}
        empty="No evaluation run of this version has been signed off."
        columns={[
          {
            header: "Verdict",
            cell: (r) => <StatusBadge status={r.decision} tone={r.decision === "accept" ? "ok" : "bad"} label={r.decision === "accept" ? "accepted" : "rejected"} />,
          },
          {
            header: "Run",
            cell: (r) => (
              <Link to={`/evaluations/runs/${r.run}`}>
                {r.run_name} · {r.suite_name} v{r.suite_version_number}
              </Link>
            ),
          },
          { header: "Signed by", cell: (r) => r.signed_by_name },
          { header: "When", cell: (r) => formatDateTime(r.signed_at) },
          { header: "Comment", className: "wrap", cell: (r) => r.comment || <span className="muted">—</span> },
          { header: "", cell: (r) => (r.current ? "current" : <span className="muted">superseded</span>) },
        ]}
        pagination={
          verdicts.data && verdicts.data.count > HISTORY_LIMIT ? (
            <Pagination count={verdicts.data.count} limit={HISTORY_LIMIT} offset={offset} onOffset={setOffset} />
          ) : undefined
        }
      />
    </Card>
  );
}

function ManifestCard({ version }: { version: ModelVersion }) {
  const [offset, setOffset] = useState(0);
  const files = useApi<ApiPage<ManifestFile>>(`/api/model-versions/${version.id}/files/`, { limit: FILES_LIMIT, offset });
  return (
    <Card title="Manifest" testId="version-manifest">
      <ErrorState error={files.error} onRetry={files.reload} />
      <Table
        rows={files.data?.results}
        loading={files.loading}
        rowKey={(f) => f.path}
        empty="No files."
        columns={[
          { header: "Path", cell: (f) => <code>{f.path}</code> },
          { header: "Size", className: "num", cell: (f) => <span title={`${f.size.toLocaleString()} bytes`}>{formatBytes(f.size)}</span> },
          { header: "sha256", cell: (f) => <code style={{ fontSize: 12 }}>{f.sha256}</code> },
        ]}
        pagination={
          files.data && files.data.count > FILES_LIMIT ? (
            <Pagination count={files.data.count} limit={FILES_LIMIT} offset={offset} onOffset={setOffset} />
          ) : undefined
        }
      />
    </Card>
  );
}

function HistoryCard({ version, refresh }: { version: ModelVersion; refresh: number }) {
  const [offset, setOffset] = useState(0);
  const [open, setOpen] = useState<number | null>(null);
  const runs = useApi<ApiPage<VerificationRun>>(`/api/model-versions/${version.id}/verifications/`, { limit: HISTORY_LIMIT, offset });
  const reloadRuns = runs.reload;
  useEffect(() => {
    if (refresh) reloadRuns();
  }, [refresh, reloadRuns]);
  const selected = runs.data?.results.find((r) => r.id === open);
  return (
    <Card title="Verification history" testId="version-history">
      <ErrorState error={runs.error} onRetry={runs.reload} />
      <Table
        rows={runs.data?.results}
        loading={runs.loading}
        rowKey={(r) => r.id}
        onRowClick={(r) => setOpen(open === r.id ? null : r.id)}
        empty="No verification runs."
        columns={[
          { header: "Started", cell: (r) => formatDateTime(r.started_at) },
          { header: "Host", cell: (r) => r.host_name },
          { header: "Result", cell: (r) => <StatusBadge status={r.ok ? "ok" : "failed"} tone={r.ok ? "ok" : "bad"} /> },
          { header: "Files", className: "num", cell: (r) => r.files_checked },
          { header: "Read", className: "num", cell: (r) => formatBytes(r.bytes_hashed) },
          { header: "Cache hits", className: "num", cell: (r) => r.cache_hits },
          { header: "Why", cell: (r) => r.trigger },
          { header: "Problems", cell: (r) => (r.problems.length ? `${r.problems.length} — click to show` : <span className="muted">none</span>) },
        ]}
        pagination={
          runs.data && runs.data.count > HISTORY_LIMIT ? (
            <Pagination count={runs.data.count} limit={HISTORY_LIMIT} offset={offset} onOffset={setOffset} />
          ) : undefined
        }
      />
      {selected && selected.problems.length > 0 && (
        <div style={{ marginTop: 16 }}>
          <h2>
            Problems on {selected.host_name} ({formatDateTime(selected.started_at)})
          </h2>
          <ProblemsTable problems={selected.problems} testId="run-problems" />
        </div>
      )}
    </Card>
  );
}
