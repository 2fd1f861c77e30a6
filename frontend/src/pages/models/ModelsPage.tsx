import { useState, type FormEvent } from "react";
import { useNavigate } from "react-router-dom";
import { api, ApiError } from "../../api/client";
import type { AliasServing, Page as ApiPage, ModelFamily, ModelVersion, Problem, QuantizationConfig } from "../../api/types";
import { useAuth } from "../../auth";
import { Dialog } from "../../components/Dialog";
import { DebouncedInputField, FormErrors, InputField, SelectField, TextareaField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { VersionServes } from "../../components/Serving";
import { StatusBadge } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatBytes, formatDateTime, formatNumber, formatParams, formatShortDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";
import { useFormState } from "../../hooks/useFormState";
import { ModelsNav } from "./ModelsNav";
import { ProblemsTable } from "./ProblemsTable";

const LIMIT = 25;
const STATES = [
  { value: "", label: "Any state" },
  { value: "registered", label: "Registered" },
  { value: "verified", label: "Verified" },
  { value: "failed", label: "Failed" },
];

/** Model versions (each pinned by a file manifest) and the families they belong to. */
export function ModelsPage() {
  const { isAdmin } = useAuth();
  const navigate = useNavigate();
  const { get, set: setParam } = useQueryParams();
  const offset = Number(get("offset")) || 0;
  const search = get("search");
  const state = get("state");
  const [registering, setRegistering] = useState(false);
  const [creatingModel, setCreatingModel] = useState(false);
  const versions = useApi<ApiPage<ModelVersion>>("/api/model-versions/", { limit: LIMIT, offset, search, state });
  const families = useApi<ApiPage<ModelFamily>>("/api/models/", { limit: 200 });
  // Which aliases each version serves, with its engines and live share: the API's one answer.
  const serving = useApi<AliasServing[]>("/api/routing/serving/");

  return (
    <Page
      title="Models"
      subtitle="Every deployed byte is pinned by a sha256 manifest and verified on each host before it runs."
      actions={
        isAdmin && (
          <>
            <button type="button" className="btn" onClick={() => setCreatingModel(true)}>
              New model
            </button>
            <button type="button" className="btn btn-primary" onClick={() => setRegistering(true)}>
              Register version
            </button>
          </>
        )
      }
    >
      <ModelsNav />
      <div className="filters">
        <DebouncedInputField label="Search" name="search" type="search" placeholder="Model, revision or path" value={search} onCommit={(v) => setParam("search", v)} />
        <SelectField label="State" name="state" value={state} options={STATES} onChange={(e) => setParam("state", e.target.value)} />
      </div>
      <ErrorState error={versions.error} onRetry={versions.reload} />
      <Table
        testId="versions-table"
        rows={versions.data?.results}
        loading={versions.loading}
        rowKey={(v) => v.id}
        onRowClick={(v) => navigate(`/models/versions/${v.id}`)}
        empty={search || state ? "No version matches." : "No versions yet. Register one from a path under the model roots."}
        columns={[
          // Ten facts per version in a 1440 px window: model and revision share a cell, the long lists
          // (aliases) wrap, and dates are short (the full time is in the tooltip).
          {
            header: "Model · revision",
            className: "wrap cell-version",
            cell: (v) => (
              <>
                <strong>{v.model_name}</strong>
                <br />
                <code>{v.revision}</code>
              </>
            ),
          },
          { header: "State", cell: (v) => <StatusBadge status={v.state} tone={v.state === "verified" ? "ok" : undefined} /> },
          { header: "Source", cell: (v) => v.source_kind },
          { header: "Params", className: "num", cell: (v) => formatParams(v.parameter_count) },
          { header: "Context", className: "num", cell: (v) => formatNumber(v.max_context, "—") },
          { header: "Files", className: "num", cell: (v) => `${v.file_count} · ${formatBytes(v.total_bytes)}` },
          { header: "Quantization", className: "wrap", cell: (v) => v.quantization_name ?? <span className="muted">—</span> },
          {
            header: "Serves",
            className: "wrap cell-aliases",
            cell: (v) => <VersionServes serving={serving.data} versionId={v.id} compact />,
          },
          {
            header: "Registered",
            cell: (v) => <span title={formatDateTime(v.created_at)}>{formatShortDateTime(v.created_at)}</span>,
          },
        ]}
        pagination={
          versions.data && versions.data.count > LIMIT ? (
            <Pagination count={versions.data.count} limit={LIMIT} offset={offset} onOffset={(o) => setParam("offset", String(o))} />
          ) : undefined
        }
      />
      <div style={{ height: 20 }} />
      <Card title="Model families" testId="families-card">
        <Table
          rows={families.data?.results}
          loading={families.loading}
          rowKey={(m) => m.id}
          empty="No model families yet."
          columns={[
            { header: "Name", cell: (m) => <strong>{m.name}</strong> },
            { header: "Architecture", cell: (m) => m.architecture || <span className="muted">—</span> },
            { header: "Task tags", wrap: true, cell: (m) => (m.task_tags.length ? m.task_tags.join(", ") : <span className="muted">—</span>) },
            { header: "Versions", className: "num", cell: (m) => m.version_count },
          ]}
        />
      </Card>
      {registering && (
        <RegisterVersionDialog
          families={families.data?.results ?? []}
          onClose={() => setRegistering(false)}
          onCreated={(v) => navigate(`/models/versions/${v.id}`)}
        />
      )}
      {creatingModel && (
        <CreateModelDialog
          onClose={() => setCreatingModel(false)}
          onCreated={() => {
            setCreatingModel(false);
            families.reload();
          }}
        />
      )}
    </Page>
  );
}

function CreateModelDialog({ onClose, onCreated }: { onClose: () => void; onCreated: () => void }) {
  const [name, setName] = useState("");
  const [tags, setTags] = useState("");
  const [description, setDescription] = useState("");
  const { error, busy, run, errors } = useFormState();

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      const task_tags = tags.split(",").map((t) => t.trim()).filter(Boolean);
      await api.post<ModelFamily>("/api/models/", { name, task_tags, description });
      onCreated();
    });
  };
  return (
    <Dialog title="New model family" open onClose={onClose} testId="create-model-dialog">
      <form onSubmit={submit} noValidate>
        <InputField label="Name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} autoFocus />
        <InputField label="Task tags" name="task_tags" value={tags} onChange={(e) => setTags(e.target.value)} errors={errors} hint="Comma-separated: chat, code, long-context" />
        <TextareaField label="Description" name="description" value={description} onChange={(e) => setDescription(e.target.value)} errors={errors} />
        <FormErrors error={error} fields={["name", "task_tags", "description"]} />
        <div className="form-actions">
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            Create model
          </button>
        </div>
      </form>
    </Dialog>
  );
}

function RegisterVersionDialog({
  families,
  onClose,
  onCreated,
}: {
  families: ModelFamily[];
  onClose: () => void;
  onCreated: (v: ModelVersion) => void;
}) {
  const [pickedModel, setModel] = useState("");
  // The families may arrive after the dialog opens; until one is picked, the first is the choice.
  const model = pickedModel || (families[0] ? String(families[0].id) : "");
  const [revision, setRevision] = useState("");
  const [sourcePath, setSourcePath] = useState("");
  const [quantization, setQuantization] = useState("");
  const [parent, setParent] = useState("");
  const [manifestFile, setManifestFile] = useState<File | null>(null);
  const { error, busy, run } = useFormState();
  const quants = useApi<ApiPage<QuantizationConfig>>("/api/quantization-configs/", { limit: 200 });
  const parents = useApi<ApiPage<ModelVersion>>("/api/model-versions/", { limit: 200 });

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      const body: Record<string, unknown> = {
        model: model ? Number(model) : null,
        revision,
        source_path: sourcePath,
        quantization: quantization ? Number(quantization) : null,
        parent: parent ? Number(parent) : null,
      };
      // The manifest file is read here and sent as text; the API checks every file against it.
      if (manifestFile) body.manifest = await manifestFile.text();
      const created = await api.post<ModelVersion>("/api/model-versions/", body);
      onCreated(created);
    });
  };

  const apiError = error instanceof ApiError ? error : null;
  const errors = apiError?.fieldErrors;
  const problems = ((apiError?.body as { problems?: Problem[] } | null)?.problems ?? []) as Problem[];
  const visibleErrors = apiError ? filterProblemErrors(apiError) : error;
  return (
    <Dialog title="Register a model version" open onClose={onClose} testId="register-version-dialog" wide>
      <form onSubmit={submit} noValidate>
        <SelectField
          label="Model"
          name="model"
          value={model}
          onChange={(e) => setModel(e.target.value)}
          errors={errors}
          options={[{ value: "", label: "Choose a model family" }, ...families.map((f) => ({ value: String(f.id), label: f.name }))]}
        />
        <InputField label="Revision" name="revision" value={revision} onChange={(e) => setRevision(e.target.value)} errors={errors} hint="A label such as main, fp16 or a commit hash." />
        <InputField
          label="Source path"
          name="source_path"
          value={sourcePath}
          onChange={(e) => setSourcePath(e.target.value)}
          errors={errors}
          hint="Absolute path on the server, under MODEL_ROOTS: a model directory or a single .gguf file."
        />
        <SelectField
          label="Quantization"
          name="quantization"
          value={quantization}
          onChange={(e) => setQuantization(e.target.value)}
          errors={errors}
          options={[{ value: "", label: "None (as checkpointed)" }, ...(quants.data?.results ?? []).map((q) => ({ value: String(q.id), label: q.name }))]}
        />
        <SelectField
          label="Quantized from (full-precision parent)"
          name="parent"
          value={parent}
          onChange={(e) => setParent(e.target.value)}
          errors={errors}
          options={[
            { value: "", label: "None: this is a full-precision version" },
            ...(parents.data?.results ?? []).filter((v) => v.parent === null).map((v) => ({ value: String(v.id), label: `${v.model_name}@${v.revision}` })),
          ]}
        />
        <div className="field">
          <label htmlFor="manifest-file">Manifest file (optional)</label>
          <input id="manifest-file" name="manifest_file" type="file" accept=".txt,.json,.sha256,text/plain,application/json" onChange={(e) => setManifestFile(e.target.files?.[0] ?? null)} />
          <div className="field-hint">sha256sum output or JSON {"{files: [{path, size, sha256}]}"}. Without one, the files found become the manifest.</div>
          {errors?.manifest && <div className="field-error" role="alert">{errors.manifest.join(" ")}</div>}
        </div>
        <FormErrors error={visibleErrors} fields={["model", "revision", "source_path", "quantization", "parent", "manifest"]} />
        {problems.length > 0 && <ProblemsTable problems={problems} testId="register-problems" />}
        <div className="form-actions">
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            {busy ? "Hashing files…" : "Register version"}
          </button>
        </div>
      </form>
    </Dialog>
  );
}

/** The problems list is shown as a table, not repeated as text lines. */
function filterProblemErrors(error: ApiError): ApiError {
  const fieldErrors = Object.fromEntries(Object.entries(error.fieldErrors).filter(([name]) => !name.startsWith("problems")));
  return new ApiError(error.status, error.message, fieldErrors, error.body);
}
