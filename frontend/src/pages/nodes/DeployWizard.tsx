import { useState, type FormEvent } from "react";
import { api, ApiError } from "../../api/client";
import type { Page as ApiPage, Deployment, Host, ModelAlias, ModelVersion, MultiHostBackend, Preflight, QuantizationConfig } from "../../api/types";
import { Dialog } from "../../components/Dialog";
import { CheckboxField, FormErrors, InputField, SelectField } from "../../components/Field";
import { useApi } from "../../hooks/useApi";
import { formatBytes } from "../../format";

const ENGINES = [
  { value: "vllm", label: "vLLM (GPU)" },
  { value: "sim", label: "vLLM simulator (no GPU needed)" },
  { value: "llamacpp", label: "llama.cpp (CPU, GGUF)" },
];
const BACKENDS: { value: MultiHostBackend; label: string }[] = [
  { value: "ray", label: "Ray cluster (agents start Ray nodes first)" },
  { value: "mp", label: "vLLM multiprocessing (--nnodes, no Ray)" },
];

/** Deploy a model version: fill in the engine parameters, see the fit check, then launch. */
export function DeployWizard({ hosts, onClose, onCreated }: { hosts: Host[]; onClose: () => void; onCreated: (d: Deployment) => void }) {
  const versions = useApi<ApiPage<ModelVersion>>("/api/model-versions/", { limit: 200 });
  const quants = useApi<ApiPage<QuantizationConfig>>("/api/quantization-configs/", { limit: 200 });
  const aliases = useApi<ApiPage<ModelAlias>>("/api/model-aliases/", { limit: 200 });
  const [form, setForm] = useState({
    name: "",
    model_version: "",
    quantization: "",
    engine: "sim",
    host: "",
    gpu_indices: "0",
    // Empty: vLLM's default (the flag is not passed); the fit check shows the value vLLM will use.
    gpu_memory_utilization: "",
    max_model_len: "8192",
    block_size: "",
    max_num_seqs: "",
    max_num_batched_tokens: "",
    pipeline_parallel_size: "1",
    // Further hosts, one pipeline stage each: "host-name:gpu,gpu host-name:gpu" (empty: one host).
    members: "",
    multi_host_backend: "ray" as MultiHostBackend,
    // Empty: vLLM's default master port (29501).
    master_port: "",
    quantization_override: "",
    enable_prefix_caching: true,
    extra_args: "",
    port: "8200",
    served_model_name: "",
    role: "",
  });
  const [check, setCheck] = useState<Preflight | null>(null);
  const [error, setError] = useState<ApiError | Error | null>(null);
  const [busy, setBusy] = useState(false);
  const set = (name: string, value: string | boolean) => {
    setForm((f) => ({ ...f, [name]: value }));
    setCheck(null);
  };

  const members = () =>
    form.members
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map((item) => {
        const [name, gpuList = ""] = item.split(":");
        const host = hosts.find((h) => h.name === name);
        return { host: host ? host.id : -1, gpu_indices: gpuList ? gpuList.split(",").map((s) => Number(s.trim())) : [] };
      });

  const body = () => {
    const gpus = form.gpu_indices.trim() ? form.gpu_indices.split(",").map((s) => Number(s.trim())) : [];
    const stages = members();
    const pp = Number(form.pipeline_parallel_size) || 1;
    return {
      model_version: Number(form.model_version) || null,
      quantization: form.quantization ? Number(form.quantization) : null,
      engine: form.engine,
      host: Number(form.host) || null,
      gpu_indices: form.engine === "llamacpp" ? [] : gpus,
      gpu_memory_utilization: form.gpu_memory_utilization ? Number(form.gpu_memory_utilization) : null,
      max_model_len: Number(form.max_model_len),
      block_size: form.block_size ? Number(form.block_size) : null,
      max_num_seqs: form.max_num_seqs ? Number(form.max_num_seqs) : null,
      max_num_batched_tokens: form.max_num_batched_tokens ? Number(form.max_num_batched_tokens) : null,
      // Across hosts, one pipeline stage per host unless the admin said otherwise.
      pipeline_parallel_size: stages.length && pp === 1 ? 1 + stages.length : pp,
      members: stages,
      multi_host_backend: form.multi_host_backend,
      master_port: form.multi_host_backend === "mp" && form.master_port ? Number(form.master_port) : null,
      quantization_override: form.quantization_override,
      enable_prefix_caching: form.enable_prefix_caching,
      extra_args: form.extra_args.trim() ? form.extra_args.trim().split(/\s+/) : [],
      port: Number(form.port),
    };
  };

  const runCheck = async () => {
    setBusy(true);
    setError(null);
    try {
      setCheck(await api.post<Preflight>("/api/deployments/preflight/", body()));
    } catch (err) {
      setError(err as Error);
    } finally {
      setBusy(false);
    }
  };

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const created = await api.post<Deployment>("/api/deployments/", {
        ...body(),
        name: form.name,
        served_model_name: form.served_model_name,
        role: form.role,
      });
      onCreated(created);
    } catch (err) {
      setError(err as Error);
    } finally {
      setBusy(false);
    }
  };

  const fieldErrors = error instanceof ApiError ? error.fieldErrors : check && !check.ok ? check.errors : undefined;
  const fields = Object.keys(form);
  return (
    <Dialog
      title="Deploy a model"
      open
      onClose={onClose}
      wide
      testId="deploy-wizard"
      footer={
        <>
          <button type="button" className="btn" onClick={onClose}>
            Cancel
          </button>
          <button type="button" className="btn" onClick={runCheck} disabled={busy} data-testid="run-fit-check">
            Check fit
          </button>
          <button type="submit" form="deploy-form" className="btn btn-primary" disabled={busy || !check?.ok} data-testid="deploy-submit">
            Deploy
          </button>
        </>
      }
    >
      <form id="deploy-form" onSubmit={submit}>
        <FormErrors error={error} fields={fields} />
        <div className="grid-2">
          <InputField label="Name" name="name" errors={fieldErrors} value={form.name} onChange={(e) => set("name", e.target.value)} required />
          <SelectField
            label="Serves as (alias)"
            name="served_model_name"
            errors={fieldErrors}
            value={form.served_model_name}
            onChange={(e) => set("served_model_name", e.target.value)}
            options={[{ value: "", label: "Choose an alias" }, ...(aliases.data?.results ?? []).map((a) => ({ value: a.name, label: a.name }))]}
          />
          <SelectField
            label="Model version"
            name="model_version"
            errors={fieldErrors}
            value={form.model_version}
            onChange={(e) => set("model_version", e.target.value)}
            options={[
              { value: "", label: "Choose a version" },
              ...(versions.data?.results ?? []).map((v) => ({
                value: String(v.id),
                label: `${v.model_name}@${v.revision} (${v.state}${v.max_context ? `, ≤${v.max_context} tokens` : ""})`,
              })),
            ]}
          />
          <SelectField
            label="Quantization"
            name="quantization"
            errors={fieldErrors}
            value={form.quantization}
            onChange={(e) => set("quantization", e.target.value)}
            options={[{ value: "", label: "The version's own" }, ...(quants.data?.results ?? []).map((q) => ({ value: String(q.id), label: q.name }))]}
          />
          <SelectField label="Engine" name="engine" errors={fieldErrors} value={form.engine} onChange={(e) => set("engine", e.target.value)} options={ENGINES} />
          <SelectField
            label="Host"
            name="host"
            errors={fieldErrors}
            value={form.host}
            onChange={(e) => set("host", e.target.value)}
            options={[
              { value: "", label: "Choose a host" },
              ...hosts.map((h) => ({ value: String(h.id), label: `${h.name}${h.reachable ? "" : " (unreachable)"} · ${h.gpus.length} GPU` })),
            ]}
          />
          <InputField label="GPU indices" name="gpu_indices" errors={fieldErrors} value={form.gpu_indices} onChange={(e) => set("gpu_indices", e.target.value)} hint="Comma-separated; tensor parallel size follows." />
          <InputField label="Port" name="port" type="number" errors={fieldErrors} value={form.port} onChange={(e) => set("port", e.target.value)} />
          <InputField
            label="GPU memory utilization"
            name="gpu_memory_utilization"
            type="number"
            step="0.01"
            errors={fieldErrors}
            value={form.gpu_memory_utilization}
            onChange={(e) => set("gpu_memory_utilization", e.target.value)}
            hint={`Empty: vLLM's default (${check?.fit?.gpu_memory_utilization ?? 0.92}).`}
          />
          <InputField label="Max model length" name="max_model_len" type="number" errors={fieldErrors} value={form.max_model_len} onChange={(e) => set("max_model_len", e.target.value)} />
          <InputField label="Block size" name="block_size" type="number" errors={fieldErrors} value={form.block_size} onChange={(e) => set("block_size", e.target.value)} hint="Empty: the attention backend's preferred size (vLLM's default)." />
          <InputField
            label="Max sequences"
            name="max_num_seqs"
            type="number"
            errors={fieldErrors}
            value={form.max_num_seqs}
            onChange={(e) => set("max_num_seqs", e.target.value)}
            hint={check?.fit ? `Empty: vLLM's default; it will use ${check.fit.max_num_seqs}.` : "Empty: vLLM's default for the GPU (Check fit shows it)."}
          />
          <InputField
            label="Max batched tokens"
            name="max_num_batched_tokens"
            type="number"
            errors={fieldErrors}
            value={form.max_num_batched_tokens}
            onChange={(e) => set("max_num_batched_tokens", e.target.value)}
            hint={check?.fit?.max_num_batched_tokens ? `Empty: vLLM's default; it will use ${check.fit.max_num_batched_tokens}.` : "Empty: vLLM's default for the GPU."}
          />
          <InputField label="Pipeline parallel size" name="pipeline_parallel_size" type="number" errors={fieldErrors} value={form.pipeline_parallel_size} onChange={(e) => set("pipeline_parallel_size", e.target.value)} hint="GPUs = tensor × pipeline, on this host." />
          <InputField
            label="Further hosts (pipeline stages)"
            name="members"
            errors={fieldErrors}
            value={form.members}
            onChange={(e) => set("members", e.target.value)}
            hint="e.g. gpu-b:0 gpu-c:0 — one stage per host, tensor parallel inside each. Empty: this host only."
          />
          {form.members.trim() && (
            <SelectField
              label="Across hosts, run with"
              name="multi_host_backend"
              errors={fieldErrors}
              value={form.multi_host_backend}
              onChange={(e) => set("multi_host_backend", e.target.value)}
              options={BACKENDS}
            />
          )}
          {form.members.trim() && form.multi_host_backend === "mp" && (
            <InputField
              label="Master port"
              name="master_port"
              type="number"
              errors={fieldErrors}
              value={form.master_port}
              onChange={(e) => set("master_port", e.target.value)}
              hint="Where every host's workers meet, on this host. Empty: vLLM's default, 29501."
            />
          )}
          <InputField
            label="Force --quantization"
            name="quantization_override"
            errors={fieldErrors}
            value={form.quantization_override}
            onChange={(e) => set("quantization_override", e.target.value)}
            hint="Empty: vLLM reads the checkpoint's quantization_config (Marlin kernels for AWQ/GPTQ)."
          />
          <InputField label="Role" name="role" errors={fieldErrors} value={form.role} onChange={(e) => set("role", e.target.value)} hint="long-context, high-throughput, cpu-postprocess or your own." />
          <InputField label="Extra engine args" name="extra_args" errors={fieldErrors} value={form.extra_args} onChange={(e) => set("extra_args", e.target.value)} hint="e.g. --sim-profile h100-llama3-8b-fp16" />
          <CheckboxField label="Prefix caching" name="enable_prefix_caching" checked={form.enable_prefix_caching} onChange={(e) => set("enable_prefix_caching", e.target.checked)} />
        </div>
        {check && (
          <div className={check.ok ? "notice notice-info" : "notice notice-bad"} data-testid="fit-result" data-ok={check.ok}>
            <strong>{check.ok ? "Ready to deploy." : "Refused before anything starts."}</strong>{" "}
            {check.fit?.reason}
            {check.fit && check.fit.vllm_defaults.length > 0 && (
              <div data-testid="vllm-defaults">vLLM will use: {check.fit.vllm_defaults.join("; ")}.</div>
            )}
            {!check.ok && (
              <ul>
                {Object.entries(check.errors).map(([field, messages]) => (
                  <li key={field}>
                    <code>{field}</code>: {messages.join(" ")}
                  </li>
                ))}
              </ul>
            )}
            {check.fit && (
              <table className="table fit-steps">
                <tbody>
                  {check.fit.steps.map((step) => (
                    <tr key={step.label}>
                      <td>{step.label}</td>
                      <td className="muted">{step.formula}</td>
                      <td className="num">{/(token|sequence|parameter)/i.test(step.label) ? step.value.toLocaleString() : formatBytes(step.value)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            )}
          </div>
        )}
      </form>
    </Dialog>
  );
}
