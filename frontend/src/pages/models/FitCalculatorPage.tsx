import { useState, type FormEvent } from "react";
import { api } from "../../api/client";
import type { Page as ApiPage, FitResult, ModelVersion } from "../../api/types";
import { FormErrors, InputField, SelectField } from "../../components/Field";
import { Card, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { useApi } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";
import { useFormState } from "../../hooks/useFormState";
import { ModelsNav } from "./ModelsNav";
import { formatBytes } from "../../format";
import { KV_DTYPES, QUANT_METHODS } from "./options";

/** "Will it fit?": weights and KV cache against a GPU's memory, with every step of the arithmetic shown. */
export function FitCalculatorPage() {
  const { get } = useQueryParams();
  const versions = useApi<ApiPage<ModelVersion>>("/api/model-versions/", { limit: 200 });
  const [version, setVersion] = useState(get("version"));
  const [method, setMethod] = useState("");
  const [kvDtype, setKvDtype] = useState("");
  const [gpuGib, setGpuGib] = useState("80");
  const [utilization, setUtilization] = useState("0.9");
  const [maxModelLen, setMaxModelLen] = useState("8192");
  const [maxNumSeqs, setMaxNumSeqs] = useState("256");
  const [overheadGib, setOverheadGib] = useState("1");
  const [gpus, setGpus] = useState("1");
  const [result, setResult] = useState<FitResult | null>(null);
  const { error, busy, run, errors } = useFormState();
  const chosen = version || (versions.data?.results[0] ? String(versions.data.results[0].id) : "");

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    const ok = await run(async () => {
      const body: Record<string, unknown> = {
        version: chosen ? Number(chosen) : null,
        // Tensor parallelism splits weights and KV cache over the GPUs; the API takes their total memory.
        gpu_memory_gib: Number(gpuGib) * Math.max(1, Number(gpus) || 1),
        tensor_parallel_size: Number(gpus),
        gpu_memory_utilization: Number(utilization),
        max_model_len: Number(maxModelLen),
        max_num_seqs: Number(maxNumSeqs),
        overhead_bytes: Math.round(Number(overheadGib) * 1024 ** 3),
      };
      if (method) body.method = method;
      if (kvDtype) body.kv_cache_dtype = kvDtype;
      setResult(await api.post<FitResult>("/api/fit-check/", body));
    });
    if (!ok) setResult(null); // a failed check shows its error, not the last result
  };
  return (
    <Page title="Models" subtitle="Answer “will it fit?” before anything is launched.">
      <ModelsNav />
      <div className="grid-2">
        <Card title="Fit calculator" testId="fit-form">
          <form onSubmit={submit} noValidate>
            <SelectField
              label="Version"
              name="version"
              value={chosen}
              onChange={(e) => setVersion(e.target.value)}
              errors={errors}
              options={(versions.data?.results ?? []).map((v) => ({ value: String(v.id), label: `${v.model_name}@${v.revision}` }))}
            />
            <SelectField
              label="Weights as"
              name="method"
              value={method}
              onChange={(e) => setMethod(e.target.value)}
              errors={errors}
              options={[{ value: "", label: "The version's own quantization" }, ...QUANT_METHODS.map((m) => ({ value: m, label: m }))]}
            />
            <SelectField
              label="KV-cache dtype"
              name="kv_cache_dtype"
              value={kvDtype}
              onChange={(e) => setKvDtype(e.target.value)}
              errors={errors}
              options={[{ value: "", label: "From the quantization config" }, ...KV_DTYPES.map((d) => ({ value: d, label: d }))]}
            />
            <div className="grid-2" style={{ gap: 12 }}>
              <InputField label="GPU memory (GiB)" name="gpu_memory_gib" type="number" step="any" value={gpuGib} onChange={(e) => setGpuGib(e.target.value)} errors={errors} hint="Per GPU" />
              <InputField label="GPUs (tensor parallel)" name="tensor_parallel_size" type="number" min={1} value={gpus} onChange={(e) => setGpus(e.target.value)} errors={errors} />
              <InputField label="gpu_memory_utilization" name="gpu_memory_utilization" type="number" step="0.01" value={utilization} onChange={(e) => setUtilization(e.target.value)} errors={errors} />
              <InputField label="max_model_len" name="max_model_len" type="number" value={maxModelLen} onChange={(e) => setMaxModelLen(e.target.value)} errors={errors} />
              <InputField label="max_num_seqs" name="max_num_seqs" type="number" value={maxNumSeqs} onChange={(e) => setMaxNumSeqs(e.target.value)} errors={errors} />
            </div>
            <InputField
              label="Runtime overhead (GiB)"
              name="overhead_bytes"
              type="number"
              step="any"
              value={overheadGib}
              onChange={(e) => setOverheadGib(e.target.value)}
              errors={errors}
              hint="Per GPU: CUDA context, activations and CUDA graphs, an assumption (vLLM logs 1–2 GiB for a 7–8B model). Use 0 for llama.cpp on CPU."
            />
            <FormErrors error={error} fields={["version", "method", "kv_cache_dtype", "gpu_memory_gib", "gpu_memory_utilization", "max_model_len", "max_num_seqs", "overhead_bytes", "tensor_parallel_size"]} />
            <div className="form-actions">
              <button type="submit" className="btn btn-primary" disabled={busy}>
                Check fit
              </button>
            </div>
          </form>
        </Card>
        <Card title="Answer" testId="fit-result">
          {!result && <p className="muted">Choose a version and a GPU, then check.</p>}
          {result && (
            <>
              <p>
                <StatusBadge status={result.fits ? "fits" : "does not fit"} tone={result.fits ? "ok" : "bad"} /> {result.reason}
              </p>
              <dl className="props">
                <dt>Weights</dt>
                <dd>{formatBytes(result.weight_bytes)}</dd>
                <dt>KV cache per token</dt>
                <dd>{formatBytes(result.kv_bytes_per_token)}</dd>
                <dt>KV cache tokens</dt>
                <dd data-testid="fit-kv-tokens">{result.kv_tokens_available.toLocaleString()}</dd>
                <dt>Largest context</dt>
                <dd data-testid="fit-max-context">{result.max_context_that_fits.toLocaleString()}</dd>
                <dt>Full-length sequences</dt>
                <dd>{result.full_length_sequences.toLocaleString()}</dd>
              </dl>
            </>
          )}
        </Card>
      </div>
      {result && (
        <Card title="The arithmetic" testId="fit-steps">
          <Table
            rows={result.steps}
            rowKey={(s) => s.label}
            columns={[
              { header: "Step", cell: (s) => <strong>{s.label}</strong> },
              { header: "Formula", wrap: true, cell: (s) => <code>{s.formula}</code> },
              { header: "Value", className: "num", cell: (s) => s.value.toLocaleString() },
            ]}
          />
        </Card>
      )}
    </Page>
  );
}
