import { useEffect, useRef, useState, type FormEvent } from "react";
import { api, ApiError } from "../../api/client";
import type {
  Page as ApiPage,
  Deployment,
  FitStep,
  Host,
  ModelAlias,
  ModelVersion,
  MultiHostBackend,
  PlacementAlternative,
  PlacementAnswer,
  Preflight,
  QuantizationConfig,
} from "../../api/types";
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
// Wait this long after the last edit before asking for placement help again.
const PLACEMENT_DEBOUNCE_MS = 250;

type Form = {
  name: string;
  model_version: string;
  quantization: string;
  engine: string;
  host: string;
  gpu_indices: number[];
  gpu_memory_utilization: string;
  max_model_len: string;
  block_size: string;
  max_num_seqs: string;
  max_num_batched_tokens: string;
  pipeline_parallel_size: string;
  members: string;
  multi_host_backend: MultiHostBackend;
  master_port: string;
  quantization_override: string;
  enable_prefix_caching: boolean;
  extra_args: string;
  port: string;
  served_model_name: string;
  role: string;
};

/** A step's value in its own unit: bytes in binary units, tokens and counts as numbers (never "0 B"). */
function formatStepValue(step: Pick<FitStep, "value" | "unit">): string {
  if (step.unit === "tokens") return `${step.value.toLocaleString()} tokens`;
  if (step.unit === "count") return step.value.toLocaleString();
  return formatBytes(step.value);
}

function ArithmeticTable({ steps, testId }: { steps: FitStep[]; testId: string }) {
  return (
    <table className="table placement-table" data-testid={testId}>
      <tbody>
        {steps.map((step) => (
          <tr key={step.label}>
            <td className="placement-label">{step.label}</td>
            <td className="muted">{step.formula}</td>
            <td className="num">{formatStepValue(step)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function sameGpus(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((value, i) => value === b[i]);
}

/** Deploy a model version: pick where it runs with placement help, see the fit check, then launch. */
export function DeployWizard({ hosts, onClose, onCreated }: { hosts: Host[]; onClose: () => void; onCreated: (d: Deployment) => void }) {
  const versions = useApi<ApiPage<ModelVersion>>("/api/model-versions/", { limit: 200 });
  const quants = useApi<ApiPage<QuantizationConfig>>("/api/quantization-configs/", { limit: 200 });
  const aliases = useApi<ApiPage<ModelAlias>>("/api/model-aliases/", { limit: 200 });
  const [form, setForm] = useState<Form>({
    name: "",
    model_version: "",
    quantization: "",
    engine: "sim",
    host: "",
    // Picked by clicking the GPU cards (or by "Use proposed placement"); tensor parallel size follows.
    gpu_indices: [],
    // Empty: vLLM's default (the flag is not passed); the fit check shows the value vLLM will use.
    gpu_memory_utilization: "",
    max_model_len: "8192",
    block_size: "",
    max_num_seqs: "",
    max_num_batched_tokens: "",
    pipeline_parallel_size: "1",
    // Further hosts, one pipeline stage each: "host-name:gpu,gpu host-name:gpu" (empty: one host).
    members: "",
    multi_host_backend: "ray",
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
  const [placement, setPlacement] = useState<PlacementAnswer | null>(null);
  const [placementError, setPlacementError] = useState<ApiError | Error | null>(null);
  const [error, setError] = useState<ApiError | Error | null>(null);
  const [busy, setBusy] = useState(false);
  const placementSeq = useRef(0);
  const llama = form.engine === "llamacpp";

  const update = (changes: Partial<Form>) => {
    setForm((f) => ({ ...f, ...changes }));
    setCheck(null);
  };
  const set = (name: keyof Form, value: string | boolean) => update({ [name]: value } as Partial<Form>);
  const setHost = (value: string) => update({ host: value, gpu_indices: [] });
  const toggleGpu = (index: number) =>
    update({
      gpu_indices: form.gpu_indices.includes(index) ? form.gpu_indices.filter((i) => i !== index) : [...form.gpu_indices, index].sort((a, b) => a - b),
    });

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

  const optionalNumber = (value: string) => (value ? Number(value) : null);

  /** The request body: only the settings the chosen engine kind takes (llama.cpp has no vLLM flags). */
  const body = () => {
    const common = {
      model_version: Number(form.model_version) || null,
      engine: form.engine,
      host: Number(form.host) || null,
      max_model_len: Number(form.max_model_len),
      max_num_batched_tokens: optionalNumber(form.max_num_batched_tokens),
      extra_args: form.extra_args.trim() ? form.extra_args.trim().split(/\s+/) : [],
      port: Number(form.port),
    };
    if (llama) return { ...common, gpu_indices: [] };
    const stages = members();
    const pp = Number(form.pipeline_parallel_size) || 1;
    return {
      ...common,
      quantization: form.quantization ? Number(form.quantization) : null,
      gpu_indices: form.gpu_indices,
      gpu_memory_utilization: optionalNumber(form.gpu_memory_utilization),
      block_size: optionalNumber(form.block_size),
      max_num_seqs: optionalNumber(form.max_num_seqs),
      // Across hosts, one pipeline stage per host unless the admin said otherwise.
      pipeline_parallel_size: stages.length && pp === 1 ? 1 + stages.length : pp,
      members: stages,
      multi_host_backend: form.multi_host_backend,
      master_port: form.multi_host_backend === "mp" && form.master_port ? Number(form.master_port) : null,
      quantization_override: form.quantization_override,
      enable_prefix_caching: form.enable_prefix_caching,
    };
  };

  // Placement help follows every edit that changes memory: free memory per GPU, a proposal, the verdict.
  const placementKey = JSON.stringify([
    form.model_version,
    form.quantization,
    form.engine,
    form.host,
    form.gpu_indices,
    form.gpu_memory_utilization,
    form.max_model_len,
    form.max_num_seqs,
    form.max_num_batched_tokens,
  ]);
  useEffect(() => {
    const maxLen = Number(form.max_model_len);
    if (!Number.isInteger(maxLen) || maxLen < 1) return;
    const seq = ++placementSeq.current;
    const request = {
      model_version: Number(form.model_version) || null,
      quantization: !llama && form.quantization ? Number(form.quantization) : null,
      engine: form.engine,
      host: Number(form.host) || null,
      gpu_indices: llama || !form.host ? [] : form.gpu_indices,
      gpu_memory_utilization: llama ? null : optionalNumber(form.gpu_memory_utilization),
      max_model_len: maxLen,
      max_num_seqs: llama ? null : optionalNumber(form.max_num_seqs),
      max_num_batched_tokens: optionalNumber(form.max_num_batched_tokens),
    };
    const timer = window.setTimeout(() => {
      api
        .post<PlacementAnswer>("/api/deployments/placement/", request)
        .then((answer) => {
          if (seq !== placementSeq.current) return;
          setPlacement(answer);
          setPlacementError(null);
        })
        .catch((err: Error) => {
          if (seq === placementSeq.current) setPlacementError(err);
        });
    }, PLACEMENT_DEBOUNCE_MS);
    return () => window.clearTimeout(timer);
  }, [placementKey]);

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

  const proposed = placement?.proposed ?? null;
  const proposalDiffers =
    proposed !== null &&
    (String(proposed.host) !== form.host ||
      !sameGpus(proposed.gpu_indices, form.gpu_indices) ||
      (proposed.lowered_utilization && String(proposed.gpu_memory_utilization) !== form.gpu_memory_utilization));
  const useProposed = () => {
    if (!proposed) return;
    update({
      host: String(proposed.host),
      gpu_indices: [...proposed.gpu_indices],
      ...(proposed.lowered_utilization ? { gpu_memory_utilization: String(proposed.gpu_memory_utilization) } : {}),
    });
  };
  const applyAlternative = (alternative: PlacementAlternative) => {
    const c = alternative.changes;
    const changes: Partial<Form> = {};
    if (c.model_version !== undefined) changes.model_version = String(c.model_version);
    if (c.quantization !== undefined) changes.quantization = c.quantization === null ? "" : String(c.quantization);
    if (c.host !== undefined) changes.host = String(c.host);
    if (c.gpu_indices !== undefined) changes.gpu_indices = [...c.gpu_indices];
    if (c.gpu_memory_utilization !== undefined) changes.gpu_memory_utilization = c.gpu_memory_utilization === null ? "" : String(c.gpu_memory_utilization);
    if (c.max_model_len !== undefined) changes.max_model_len = String(c.max_model_len);
    update(changes);
  };

  const hostFree = placement?.hosts.find((h) => String(h.host) === form.host);
  const pickedHost = hosts.find((h) => String(h.id) === form.host);
  const gpuCards = (pickedHost?.gpus ?? [])
    .map((gpu) => ({ gpu, free: hostFree?.gpus.find((g) => g.index === gpu.index) }))
    .sort((a, b) => a.gpu.index - b.gpu.index);
  const verdict = placement?.verdict ?? null;

  const fieldErrors = error instanceof ApiError ? error.fieldErrors : check && !check.ok ? check.errors : undefined;
  const fields = Object.keys(form);
  const gpuErrors = fieldErrors?.gpu_indices ?? [];
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
      <section className="placement" data-testid="placement-help" aria-label="Placement help">
        {placementError && (
          <div className="notice notice-bad" data-testid="placement-error">
            Placement help failed: {placementError instanceof ApiError ? Object.values(placementError.fieldErrors ?? {}).flat().join(" ") || placementError.message : placementError.message}
          </div>
        )}
        {placement && !verdict && placement.note && (
          <p className="muted" data-testid="placement-note">
            {placement.note}
          </p>
        )}
        {verdict && (
          <div className={verdict.fits ? "placement-verdict placement-fits" : "placement-verdict placement-misses"} data-testid="placement-verdict" data-fits={verdict.fits}>
            <div className="placement-head">
              <strong data-testid="placement-verdict-title">
                {verdict.fits ? "Fits" : "Does not fit"} on {verdict.host_name} GPU {verdict.gpu_indices.join(", ")}
              </strong>
              {proposed && proposalDiffers && (
                <button type="button" className="btn btn-primary" onClick={useProposed} data-testid="use-proposed-placement">
                  Use proposed placement: {proposed.host_name} GPU {proposed.gpu_indices.join(", ")}
                  {proposed.lowered_utilization ? ` at gpu_memory_utilization ${proposed.gpu_memory_utilization}` : ""}
                </button>
              )}
            </div>
            <p className="placement-reason">{verdict.reason}</p>
            {!verdict.fits && placement?.note && <p className="placement-reason">{placement.note}</p>}
            {!verdict.fits && placement && placement.alternatives.length > 0 && (
              <div data-testid="placement-alternatives">
                <strong>What would fit</strong>
                <ul className="placement-alternatives">
                  {placement.alternatives.map((alt) => (
                    <li key={`${alt.kind}-${alt.label}`} data-testid={`alternative-${alt.kind}`}>
                      <div>
                        <div>{alt.label}</div>
                        <div className="muted">{alt.reason}</div>
                      </div>
                      <button type="button" className="btn" onClick={() => applyAlternative(alt)} data-testid={`apply-alternative-${alt.kind}`}>
                        Apply
                      </button>
                    </li>
                  ))}
                </ul>
              </div>
            )}
            <h3 className="placement-subhead">The arithmetic</h3>
            <ArithmeticTable steps={verdict.lines} testId="placement-arithmetic" />
            <table className="table placement-table" data-testid="placement-gpus">
              <thead>
                <tr>
                  <th>GPU</th>
                  <th className="num">total</th>
                  <th className="num">free (others reserve)</th>
                  <th className="num">budget ({verdict.gpu_memory_utilization} × total)</th>
                  <th>room</th>
                </tr>
              </thead>
              <tbody>
                {verdict.gpus.map((g) => (
                  <tr key={g.index}>
                    <td>
                      GPU {g.index} · {g.name}
                    </td>
                    <td className="num">{formatBytes(g.memory_total_bytes)}</td>
                    <td className="num">
                      {formatBytes(g.free_bytes)} ({Math.round(g.reserved_fraction * 100)} % reserved)
                    </td>
                    <td className="num">{formatBytes(g.budget_bytes)}</td>
                    <td>{g.ok ? "fits beside the others" : "taken: lower the utilization or pick another GPU"}</td>
                  </tr>
                ))}
              </tbody>
            </table>
            <h3 className="placement-subhead">How vLLM sizes the KV cache</h3>
            <ArithmeticTable steps={verdict.fit.steps} testId="placement-fit-steps" />
          </div>
        )}
      </section>
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
          <SelectField label="Engine" name="engine" errors={fieldErrors} value={form.engine} onChange={(e) => set("engine", e.target.value)} options={ENGINES} />
          {!llama && (
            <SelectField
              label="Quantization"
              name="quantization"
              errors={fieldErrors}
              value={form.quantization}
              onChange={(e) => set("quantization", e.target.value)}
              options={[{ value: "", label: "The version's own" }, ...(quants.data?.results ?? []).map((q) => ({ value: String(q.id), label: q.name }))]}
            />
          )}
          <SelectField
            label="Host"
            name="host"
            errors={fieldErrors}
            value={form.host}
            onChange={(e) => setHost(e.target.value)}
            options={[
              { value: "", label: "Choose a host" },
              ...hosts.map((h) => ({ value: String(h.id), label: `${h.name}${h.reachable ? "" : " (unreachable)"} · ${h.gpus.length} GPU` })),
            ]}
          />
        </div>
        {!llama && (
          <fieldset className={gpuErrors.length ? "gpu-picker field-invalid" : "gpu-picker"} data-testid="gpu-picker">
            <legend>GPUs {form.gpu_indices.length > 0 && <span className="muted">(tensor parallel {form.gpu_indices.length})</span>}</legend>
            {!pickedHost && <p className="muted">Choose a host to pick its GPUs, or use the proposed placement.</p>}
            {pickedHost && gpuCards.length === 0 && <p className="muted">{pickedHost.name} reports no GPUs.</p>}
            {hostFree && !hostFree.usable && <p className="muted">{hostFree.note}</p>}
            <div className="gpu-cards">
              {gpuCards.map(({ gpu, free }) => (
                <label key={gpu.index} className={form.gpu_indices.includes(gpu.index) ? "gpu-card gpu-card-picked" : "gpu-card"} data-testid={`gpu-card-${gpu.index}`}>
                  <input type="checkbox" checked={form.gpu_indices.includes(gpu.index)} onChange={() => toggleGpu(gpu.index)} aria-label={`GPU ${gpu.index}`} />
                  <span className="gpu-card-text">
                    <strong>
                      GPU {gpu.index} · {gpu.name}
                    </strong>
                    <span>{formatBytes(gpu.memory_total_bytes)} total</span>
                    <span data-testid={`gpu-free-${gpu.index}`}>{free ? `${formatBytes(free.free_bytes)} free` : "free: …"}</span>
                    {free && free.holders.length > 0 && (
                      <span className="muted">held by {free.holders.map((h) => `${h.deployment} (${Math.round(h.fraction * 100)} %)`).join(", ")}</span>
                    )}
                  </span>
                </label>
              ))}
            </div>
            {gpuErrors.length > 0 && (
              <div className="field-error" role="alert">
                {gpuErrors.join(" ")}
              </div>
            )}
          </fieldset>
        )}
        {llama && <p className="muted" data-testid="llamacpp-settings-note">llama.cpp runs on the host's CPU: no GPUs, and none of vLLM's settings apply.</p>}
        <div className="grid-2">
          <InputField label="Port" name="port" type="number" errors={fieldErrors} value={form.port} onChange={(e) => set("port", e.target.value)} />
          <InputField
            label={llama ? "Context size (n_ctx)" : "Max model length"}
            name="max_model_len"
            type="number"
            errors={fieldErrors}
            value={form.max_model_len}
            onChange={(e) => set("max_model_len", e.target.value)}
          />
          {!llama && (
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
          )}
          {!llama && (
            <InputField label="Block size" name="block_size" type="number" errors={fieldErrors} value={form.block_size} onChange={(e) => set("block_size", e.target.value)} hint="Empty: the attention backend's preferred size (vLLM's default)." />
          )}
          {!llama && (
            <InputField
              label="Max sequences"
              name="max_num_seqs"
              type="number"
              errors={fieldErrors}
              value={form.max_num_seqs}
              onChange={(e) => set("max_num_seqs", e.target.value)}
              hint={check?.fit ? `Empty: vLLM's default; it will use ${check.fit.max_num_seqs}.` : "Empty: vLLM's default for the GPU (Check fit shows it)."}
            />
          )}
          <InputField
            label={llama ? "Batch size (n_batch)" : "Max batched tokens"}
            name="max_num_batched_tokens"
            type="number"
            errors={fieldErrors}
            value={form.max_num_batched_tokens}
            onChange={(e) => set("max_num_batched_tokens", e.target.value)}
            hint={
              llama
                ? "Empty: llama-cpp-python's default (512)."
                : check?.fit?.max_num_batched_tokens
                  ? `Empty: vLLM's default; it will use ${check.fit.max_num_batched_tokens}.`
                  : "Empty: vLLM's default for the GPU."
            }
          />
          {!llama && (
            <InputField label="Pipeline parallel size" name="pipeline_parallel_size" type="number" errors={fieldErrors} value={form.pipeline_parallel_size} onChange={(e) => set("pipeline_parallel_size", e.target.value)} hint="GPUs = tensor × pipeline, on this host." />
          )}
          {!llama && (
            <InputField
              label="Further hosts (pipeline stages)"
              name="members"
              errors={fieldErrors}
              value={form.members}
              onChange={(e) => set("members", e.target.value)}
              hint="e.g. gpu-b:0 gpu-c:0 — one stage per host, tensor parallel inside each. Empty: this host only."
            />
          )}
          {!llama && form.members.trim() && (
            <SelectField
              label="Across hosts, run with"
              name="multi_host_backend"
              errors={fieldErrors}
              value={form.multi_host_backend}
              onChange={(e) => set("multi_host_backend", e.target.value)}
              options={BACKENDS}
            />
          )}
          {!llama && form.members.trim() && form.multi_host_backend === "mp" && (
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
          {!llama && (
            <InputField
              label="Force --quantization"
              name="quantization_override"
              errors={fieldErrors}
              value={form.quantization_override}
              onChange={(e) => set("quantization_override", e.target.value)}
              hint="Empty: vLLM reads the checkpoint's quantization_config (Marlin kernels for AWQ/GPTQ)."
            />
          )}
          <InputField label="Role" name="role" errors={fieldErrors} value={form.role} onChange={(e) => set("role", e.target.value)} hint="long-context, high-throughput, cpu-postprocess or your own." />
          <InputField
            label="Extra engine args"
            name="extra_args"
            errors={fieldErrors}
            value={form.extra_args}
            onChange={(e) => set("extra_args", e.target.value)}
            hint={llama ? "llama-cpp-python's server flags, e.g. --n_threads 4" : "e.g. --sim-profile h100-llama3-8b-fp16"}
          />
          {!llama && <CheckboxField label="Prefix caching" name="enable_prefix_caching" checked={form.enable_prefix_caching} onChange={(e) => set("enable_prefix_caching", e.target.checked)} />}
        </div>
        {check && (
          <div className={check.ok ? "notice notice-info fit-result" : "notice notice-bad fit-result"} data-testid="fit-result" data-ok={check.ok}>
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
            {check.fit && <ArithmeticTable steps={check.fit.steps} testId="fit-steps" />}
          </div>
        )}
      </form>
    </Dialog>
  );
}
