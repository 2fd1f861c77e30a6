import { useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { api } from "../../api/client";
import type { Page as ApiPage } from "../../api/types";
import { useAuth } from "../../auth";
import { Dialog } from "../../components/Dialog";
import { FormErrors, InputField, SelectField, TextareaField } from "../../components/Field";
import { ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useFormState } from "../../hooks/useFormState";
import { ModelsNav } from "./ModelsNav";
import { ServingSplit } from "../../components/Serving";
import type { AliasServing, ModelAlias, ModelVersion } from "../../api/types";

/** Aliases: the model names tenants send. Switching one to another version is audited. */
export function AliasesPage() {
  const { isAdmin } = useAuth();
  const aliases = useApi<ApiPage<ModelAlias>>("/api/model-aliases/", { limit: 200 });
  const versions = useApi<ApiPage<ModelVersion>>("/api/model-versions/", { limit: 200 });
  // Which versions serve each alias: configured share, engines and the request log's live share (the API's
  // one answer; nothing is worked out here).
  const serving = useApi<AliasServing[]>("/api/routing/serving/");
  const servingBy = new Map((serving.data ?? []).map((s) => [s.alias, s]));
  const [creating, setCreating] = useState(false);
  const [switching, setSwitching] = useState<ModelAlias | null>(null);
  const choices = (versions.data?.results ?? []).filter((v) => v.state !== "failed");

  return (
    <Page
      title="Models"
      subtitle="An alias is the model name clients send (and the engine's --served-model-name)."
      actions={
        isAdmin && (
          <button type="button" className="btn btn-primary" onClick={() => setCreating(true)}>
            New alias
          </button>
        )
      }
    >
      <ModelsNav />
      <ErrorState error={aliases.error} onRetry={aliases.reload} />
      <Table
        testId="aliases-table"
        rows={aliases.data?.results}
        loading={aliases.loading}
        rowKey={(a) => a.id}
        empty="No aliases yet."
        columns={[
          { header: "Alias", wrap: true, cell: (a) => <code>{a.name}</code> },
          { header: "Active version", wrap: true, cell: (a) => <Link to={`/models/versions/${a.active_version}`}>{a.active_version_label}</Link> },
          { header: "State", cell: (a) => <StatusBadge status={a.active_version_state} tone={a.active_version_state === "verified" ? "ok" : undefined} /> },
          {
            header: "Serving: configured / live",
            className: "wrap",
            cell: (a) => {
              const row = servingBy.get(a.id);
              if (!row) return <span className="muted">{serving.loading ? "…" : "—"}</span>;
              return (
                <>
                  <ServingSplit serving={row} />
                  {row.rollout && (
                    <Link to={`/rollouts?id=${row.rollout}`} className="muted">
                      rollout #{row.rollout} ({row.rollout_state})
                    </Link>
                  )}
                </>
              );
            },
          },
          { header: "Task tags", wrap: true, cell: (a) => (a.task_tags.length ? a.task_tags.join(", ") : <span className="muted">—</span>) },
          { header: "Updated", priority: 1, cell: (a) => formatDateTime(a.updated_at) },
          {
            header: "",
            className: "actions-cell",
            cell: (a) =>
              isAdmin && (
                <button type="button" className="btn btn-small" onClick={() => setSwitching(a)}>
                  Switch version
                </button>
              ),
          },
        ]}
      />
      {creating && (
        <AliasDialog
          versions={choices}
          onClose={() => setCreating(false)}
          onDone={() => {
            setCreating(false);
            aliases.reload();
          }}
        />
      )}
      {switching && (
        <AliasDialog
          alias={switching}
          versions={choices}
          onClose={() => setSwitching(null)}
          onDone={() => {
            setSwitching(null);
            aliases.reload();
          }}
        />
      )}
    </Page>
  );
}

function AliasDialog({ alias, versions, onClose, onDone }: { alias?: ModelAlias; versions: ModelVersion[]; onClose: () => void; onDone: () => void }) {
  const [name, setName] = useState(alias?.name ?? "");
  const [pickedVersion, setVersion] = useState(alias ? String(alias.active_version) : "");
  // The versions may arrive after the dialog opens; until one is picked, the first is the choice, read on
  // each render. (Read once at mount, a dialog opened before they came showed one and sent none.)
  const version = pickedVersion || (versions[0] ? String(versions[0].id) : "");
  const [tags, setTags] = useState(alias?.task_tags.join(", ") ?? "");
  const [description, setDescription] = useState(alias?.description ?? "");
  const { error, busy, run, errors } = useFormState();

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      if (alias) {
        await api.post(`/api/model-aliases/${alias.id}/switch/`, { version: Number(version) });
      } else {
        const task_tags = tags.split(",").map((t) => t.trim()).filter(Boolean);
        await api.post("/api/model-aliases/", { name, active_version: version ? Number(version) : null, task_tags, description });
      }
      onDone();
    });
  };
  const options = versions.map((v) => ({ value: String(v.id), label: `${v.model_name}@${v.revision} (${v.state})` }));
  return (
    <Dialog title={alias ? `Switch ${alias.name}` : "New alias"} open onClose={onClose} testId="alias-dialog">
      <form onSubmit={submit} noValidate>
        {!alias && <InputField label="Alias" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} hint="What clients send as model, e.g. llama-3-8b." autoFocus />}
        <SelectField label="Version" name={alias ? "version" : "active_version"} value={version} onChange={(e) => setVersion(e.target.value)} errors={errors} options={options} />
        {!alias && (
          <>
            <InputField label="Task tags" name="task_tags" value={tags} onChange={(e) => setTags(e.target.value)} errors={errors} hint="Comma-separated" />
            <TextareaField label="Description" name="description" value={description} onChange={(e) => setDescription(e.target.value)} errors={errors} />
          </>
        )}
        {alias && <p className="muted">Every proxy picks up the new version at once; the switch is recorded in the audit log.</p>}
        <FormErrors error={error} fields={["name", "active_version", "version", "task_tags", "description"]} />
        <div className="form-actions">
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            {alias ? "Switch" : "Create alias"}
          </button>
        </div>
      </form>
    </Dialog>
  );
}
