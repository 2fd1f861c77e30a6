import { useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { api } from "../../api/client";
import type { Page as ApiPage, LineageNode, QuantizationConfig } from "../../api/types";
import { useAuth } from "../../auth";
import { Dialog } from "../../components/Dialog";
import { FormErrors, InputField, SelectField, TextareaField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { useApi } from "../../hooks/useApi";
import { useFormState } from "../../hooks/useFormState";
import { ModelsNav } from "./ModelsNav";
import { KV_DTYPES, QUANT_METHODS } from "./options";

/** Quantization configs, and the lineage tree: which quantized version was made from which full-precision one. */
export function QuantizationPage() {
  const { isAdmin } = useAuth();
  const configs = useApi<ApiPage<QuantizationConfig>>("/api/quantization-configs/", { limit: 200 });
  const lineage = useApi<LineageNode[]>("/api/model-versions/lineage/");
  const [creating, setCreating] = useState(false);

  return (
    <Page
      title="Models"
      subtitle="A quantized version records the full-precision version it was made from: evaluations use that as the reference."
      actions={
        isAdmin && (
          <button type="button" className="btn btn-primary" onClick={() => setCreating(true)}>
            New quantization config
          </button>
        )
      }
    >
      <ModelsNav />
      <Card title="Lineage" testId="lineage-tree">
        <ErrorState error={lineage.error} onRetry={lineage.reload} />
        {lineage.data && lineage.data.length === 0 && <p className="muted">No versions yet.</p>}
        {lineage.data && <LineageTree nodes={lineage.data} />}
      </Card>
      <Card title="Quantization configs" testId="quant-configs">
        <ErrorState error={configs.error} onRetry={configs.reload} />
        <Table
          rows={configs.data?.results}
          loading={configs.loading}
          rowKey={(q) => q.id}
          empty="No quantization configs yet."
          columns={[
            { header: "Name", cell: (q) => <strong>{q.name}</strong> },
            { header: "Method", cell: (q) => <code>{q.method}</code> },
            { header: "Bits", className: "num", cell: (q) => q.bits },
            { header: "Group size", className: "num", cell: (q) => q.group_size ?? "—" },
            { header: "KV cache", cell: (q) => <code>{q.kv_cache_dtype}</code> },
            { header: "Description", cell: (q) => q.description || <span className="muted">—</span> },
          ]}
        />
      </Card>
      {creating && (
        <CreateQuantDialog
          onClose={() => setCreating(false)}
          onCreated={() => {
            setCreating(false);
            configs.reload();
          }}
        />
      )}
    </Page>
  );
}

function LineageTree({ nodes }: { nodes: LineageNode[] }) {
  return (
    <ul style={{ listStyle: "none", paddingLeft: 18, margin: 0, borderLeft: "1px solid var(--border)" }}>
      {nodes.map((node) => (
        <li key={node.id} style={{ margin: "6px 0" }} data-testid={`lineage-${node.id}`}>
          <Link to={`/models/versions/${node.id}`}>{node.label}</Link>{" "}
          <StatusBadge status={node.state} tone={node.state === "verified" ? "ok" : undefined} />{" "}
          <span className="muted">{node.quantization ? `${node.quantization} (${node.method})` : "full precision"}</span>
          {node.children.length > 0 && <LineageTree nodes={node.children} />}
        </li>
      ))}
    </ul>
  );
}

function CreateQuantDialog({ onClose, onCreated }: { onClose: () => void; onCreated: () => void }) {
  const [name, setName] = useState("");
  const [method, setMethod] = useState("awq");
  const [bits, setBits] = useState("4");
  const [groupSize, setGroupSize] = useState("128");
  const [kvDtype, setKvDtype] = useState("auto");
  const [description, setDescription] = useState("");
  const { error, busy, run, errors } = useFormState();

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      await api.post("/api/quantization-configs/", {
        name,
        method,
        bits: Number(bits),
        group_size: groupSize ? Number(groupSize) : null,
        kv_cache_dtype: kvDtype,
        description,
      });
      onCreated();
    });
  };
  return (
    <Dialog title="New quantization config" open onClose={onClose} testId="quant-dialog">
      <form onSubmit={submit} noValidate>
        <InputField label="Name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} autoFocus />
        <SelectField label="Method" name="method" value={method} onChange={(e) => setMethod(e.target.value)} errors={errors} options={QUANT_METHODS.map((m) => ({ value: m, label: m }))} />
        <InputField label="Bits" name="bits" type="number" value={bits} onChange={(e) => setBits(e.target.value)} errors={errors} />
        <InputField label="Group size" name="group_size" type="number" value={groupSize} onChange={(e) => setGroupSize(e.target.value)} errors={errors} hint="awq/gptq only; leave empty otherwise." />
        <SelectField label="KV-cache dtype" name="kv_cache_dtype" value={kvDtype} onChange={(e) => setKvDtype(e.target.value)} errors={errors} options={KV_DTYPES.map((d) => ({ value: d, label: d }))} />
        <TextareaField label="Description" name="description" value={description} onChange={(e) => setDescription(e.target.value)} errors={errors} />
        <FormErrors error={error} fields={["name", "method", "bits", "group_size", "kv_cache_dtype", "description"]} />
        <div className="form-actions">
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            Create config
          </button>
        </div>
      </form>
    </Dialog>
  );
}
