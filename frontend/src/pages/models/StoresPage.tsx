import { useState, type FormEvent } from "react";
import { api } from "../../api/client";
import type { Page as ApiPage, ModelStore, StoreKind } from "../../api/types";
import { useAuth } from "../../auth";
import { Dialog } from "../../components/Dialog";
import { CheckboxField, FormErrors, InputField, SelectField, TextareaField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { useApi } from "../../hooks/useApi";
import { useFormState } from "../../hooks/useFormState";
import { ModelsNav } from "./ModelsNav";

const KINDS = [
  { value: "directory", label: "Directory (a path every agent can read)" },
  { value: "http", label: "HTTP server (answers Range requests)" },
  { value: "s3", label: "S3-compatible bucket (boto3 on the hosts)" },
] as const satisfies ReadonlyArray<{ value: StoreKind; label: string }>;

const LOCATION_HINT: Record<StoreKind, string> = {
  directory: "An absolute path, e.g. /mnt/models.",
  http: "A base URL, e.g. http://10.0.0.5:8080/store.",
  s3: "A bucket, optionally with a prefix: models-bucket/prod.",
};

/** Where agents fetch a version's files before a launch; one store is active at a time. */
export function StoresPage() {
  const { isAdmin } = useAuth();
  const stores = useApi<ApiPage<ModelStore>>("/api/model-stores/", { limit: 200 });
  const [creating, setCreating] = useState(false);
  const activate = useFormState();

  const makeActive = (store: ModelStore) => {
    void activate.run(async () => {
      await api.patch(`/api/model-stores/${store.id}/`, { is_active: true });
      stores.reload();
    });
  };

  return (
    <Page
      title="Models"
      subtitle="Before a launch, the host's agent copies the version's files from the active store into its own model root, checking every byte against the manifest."
      actions={
        isAdmin && (
          <button type="button" className="btn btn-primary" onClick={() => setCreating(true)}>
            New model store
          </button>
        )
      }
    >
      <ModelsNav />
      <Card title="Model stores" testId="model-stores">
        <ErrorState error={stores.error} onRetry={stores.reload} />
        <FormErrors error={activate.error} />
        <Table
          rows={stores.data?.results}
          loading={stores.loading}
          rowKey={(s) => s.id}
          empty="No model store: every host reads a version from its registered path, which must be the same on each host."
          columns={[
            { header: "Name", cell: (s) => <strong>{s.name}</strong> },
            { header: "Kind", cell: (s) => <code>{s.kind}</code> },
            { header: "Location", wrap: true, cell: (s) => <code>{s.location}</code> },
            { header: "Endpoint", wrap: true, cell: (s) => (s.endpoint_url ? <code>{s.endpoint_url}</code> : <span className="muted">—</span>) },
            {
              header: "State",
              cell: (s) => (s.is_active ? <StatusBadge status="active" tone="ok" /> : <span className="muted">inactive</span>),
            },
            { header: "Description", wrap: true, cell: (s) => s.description || <span className="muted">—</span> },
            {
              header: "",
              cell: (s) =>
                isAdmin && !s.is_active ? (
                  <button type="button" className="btn" onClick={() => makeActive(s)} disabled={activate.busy}>
                    Make active
                  </button>
                ) : null,
            },
          ]}
        />
      </Card>
      {creating && (
        <CreateStoreDialog
          onClose={() => setCreating(false)}
          onCreated={() => {
            setCreating(false);
            stores.reload();
          }}
        />
      )}
    </Page>
  );
}

function CreateStoreDialog({ onClose, onCreated }: { onClose: () => void; onCreated: () => void }) {
  const [name, setName] = useState("");
  const [kind, setKind] = useState<StoreKind>("http");
  const [location, setLocation] = useState("");
  const [endpointUrl, setEndpointUrl] = useState("");
  const [region, setRegion] = useState("");
  const [active, setActive] = useState(true);
  const [description, setDescription] = useState("");
  const { error, busy, run, errors } = useFormState();

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      await api.post("/api/model-stores/", {
        name,
        kind,
        location,
        endpoint_url: kind === "s3" ? endpointUrl : "",
        region: kind === "s3" ? region : "",
        is_active: active,
        description,
      });
      onCreated();
    });
  };
  return (
    <Dialog title="New model store" open onClose={onClose} testId="store-dialog">
      <form onSubmit={submit} noValidate>
        <InputField label="Name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} autoFocus />
        <SelectField label="Kind" name="kind" value={kind} onChange={(e) => setKind(e.target.value as StoreKind)} errors={errors} options={[...KINDS]} />
        <InputField label="Location" name="location" value={location} onChange={(e) => setLocation(e.target.value)} errors={errors} hint={LOCATION_HINT[kind]} />
        {kind === "s3" && (
          <>
            <InputField label="Endpoint URL" name="endpoint_url" value={endpointUrl} onChange={(e) => setEndpointUrl(e.target.value)} errors={errors} hint="Blank for AWS; e.g. http://minio.internal:9000. Credentials stay on the hosts (boto3's usual environment)." />
            <InputField label="Region" name="region" value={region} onChange={(e) => setRegion(e.target.value)} errors={errors} />
          </>
        )}
        <CheckboxField label="Active (agents fetch from it)" name="is_active" checked={active} onChange={(e) => setActive(e.target.checked)} errors={errors} />
        <TextareaField label="Description" name="description" value={description} onChange={(e) => setDescription(e.target.value)} errors={errors} />
        <FormErrors error={error} fields={["name", "kind", "location", "endpoint_url", "region", "is_active", "description"]} />
        <div className="form-actions">
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            Create store
          </button>
        </div>
      </form>
    </Dialog>
  );
}
