import { useEffect, useState, type FormEvent } from "react";
import { api, ApiError, errorMessage } from "../../api/client";
import type { Page as ApiPage, DefaultReference, Deployment, EvalRun, EvalSuiteVersion, RunCreateRequest } from "../../api/types";
import { Dialog } from "../../components/Dialog";
import { FormErrors, InputField, SelectField } from "../../components/Field";
import { useApi } from "../../hooks/useApi";
import { useFormState } from "../../hooks/useFormState";

// The API's defaults (RunCreateSerializer), shown filled in so the user sees what a run will use.
const DEFAULTS = { max_tokens: "256", seed: "0", concurrency: "8", top_logprobs: "5", request_timeout: "120" };

const FIELDS = ["name", "suite_version", "candidate_deployment", "reference_deployment", ...Object.keys(DEFAULTS)];

function deploymentLabel(d: Deployment): string {
  return `${d.name} · ${d.model_version_label} on ${d.host_name}`;
}

interface NewRunDialogProps {
  open: boolean;
  /** A suite version to start with (the suite page's "Run…"). */
  suiteVersion?: number;
  onClose: () => void;
  onCreated: (run: EvalRun) => void;
}

/** Start a run: a suite version, a candidate deployment and a reference (by default the one the API picks:
 *  a ready deployment of the candidate's lineage parent), with the sampling parameters. */
export function NewRunDialog({ open, suiteVersion, onClose, onCreated }: NewRunDialogProps) {
  const versions = useApi<ApiPage<EvalSuiteVersion>>(open ? "/api/eval-suite-versions/" : null, { limit: 500 });
  const deployments = useApi<ApiPage<Deployment>>(open ? "/api/deployments/" : null, { state: "ready", limit: 500 });
  const [form, setForm] = useState({ name: "", suite_version: "", candidate: "", reference: "", ...DEFAULTS });
  const [fallback, setFallback] = useState<{ reference?: DefaultReference; why?: string } | null>(null);
  const { error, busy, run, clearError, errors } = useFormState();
  const set = (name: keyof typeof form, value: string) => setForm((f) => ({ ...f, [name]: value }));

  // The version to start with: the one asked for, else the first listed (the API orders by suite, newest first).
  const versionList = versions.data?.results;
  useEffect(() => {
    const first = versionList?.[0];
    if (!first) return;
    setForm((f) => (f.suite_version ? f : { ...f, suite_version: String(suiteVersion ?? first.id) }));
  }, [versionList, suiteVersion]);

  // What the API would take as the reference for this candidate, or why it has none.
  useEffect(() => {
    setFallback(null);
    if (!form.candidate) return;
    let cancelled = false;
    api
      .get<DefaultReference>("/api/eval-runs/default-reference/", { candidate_deployment: form.candidate })
      .then((reference) => !cancelled && setFallback({ reference }))
      .catch((err: unknown) => {
        if (cancelled) return;
        const why = err instanceof ApiError ? (err.fieldErrors["reference_deployment"] ?? err.fieldErrors["candidate_deployment"]) : undefined;
        setFallback({ why: why?.join(" ") ?? errorMessage(err) });
      });
    return () => {
      cancelled = true;
    };
  }, [form.candidate]);

  const close = () => {
    setForm({ name: "", suite_version: "", candidate: "", reference: "", ...DEFAULTS });
    clearError();
    onClose();
  };

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      const body: RunCreateRequest = {
        name: form.name,
        suite_version: Number(form.suite_version),
        candidate_deployment: form.candidate ? Number(form.candidate) : null,
        reference_deployment: form.reference ? Number(form.reference) : null,
        max_tokens: Number(form.max_tokens),
        seed: Number(form.seed),
        concurrency: Number(form.concurrency),
        top_logprobs: Number(form.top_logprobs),
        request_timeout: Number(form.request_timeout),
      };
      const created = await api.post<EvalRun>("/api/eval-runs/", body);
      close();
      onCreated(created);
    });
  };

  const ready = deployments.data?.results ?? [];
  const versionOptions = (versionList ?? []).map((v) => ({
    value: String(v.id),
    label: `${v.suite_name} v${v.number} · ${v.case_count} cases${v.locked ? "" : " · draft (a run locks it)"}`,
  }));
  const referenceHint = form.reference
    ? "Compared with this deployment instead of the lineage parent."
    : fallback?.reference
      ? `Default: ${fallback.reference.label}, the candidate's lineage parent.`
      : fallback?.why
        ? `No default: ${fallback.why}`
        : "Default: a ready deployment of the candidate's lineage parent.";

  return (
    <Dialog title="New evaluation run" open={open} onClose={close} testId="new-run-dialog" wide>
      <form onSubmit={submit} noValidate>
        <InputField label="Name" name="name" value={form.name} onChange={(e) => set("name", e.target.value)} errors={errors} placeholder="Optional, e.g. q4 vs fp16 on facts" />
        <SelectField
          label="Suite version"
          name="suite_version"
          value={form.suite_version}
          onChange={(e) => set("suite_version", e.target.value)}
          errors={errors}
          options={versionList ? versionOptions : [{ value: "", label: "Loading…" }]}
        />
        <SelectField
          label="Candidate"
          name="candidate_deployment"
          value={form.candidate}
          onChange={(e) => set("candidate", e.target.value)}
          errors={errors}
          hint={deployments.data && ready.length === 0 ? "No deployment is ready: deploy the candidate first (Nodes)." : "A ready deployment of the model version under test."}
          options={[{ value: "", label: "Pick a ready deployment…" }, ...ready.map((d) => ({ value: String(d.id), label: deploymentLabel(d) }))]}
        />
        <SelectField
          label="Reference"
          name="reference_deployment"
          value={form.reference}
          onChange={(e) => set("reference", e.target.value)}
          errors={errors}
          hint={<span data-testid="reference-hint">{referenceHint}</span>}
          options={[
            { value: "", label: fallback?.reference ? `Default: ${fallback.reference.label}` : "Default: the candidate's lineage parent" },
            ...ready.filter((d) => String(d.id) !== form.candidate).map((d) => ({ value: String(d.id), label: deploymentLabel(d) })),
          ]}
        />
        <div className="form-row">
          <InputField label="Max tokens" name="max_tokens" type="number" min={1} value={form.max_tokens} onChange={(e) => set("max_tokens", e.target.value)} errors={errors} hint="Per answer, each side." />
          <InputField label="Seed" name="seed" type="number" min={0} value={form.seed} onChange={(e) => set("seed", e.target.value)} errors={errors} hint="Decoding is greedy." />
          <InputField label="Concurrency" name="concurrency" type="number" min={1} value={form.concurrency} onChange={(e) => set("concurrency", e.target.value)} errors={errors} hint="Requests in flight per side." />
        </div>
        <div className="form-row">
          <InputField label="Top logprobs" name="top_logprobs" type="number" min={0} value={form.top_logprobs} onChange={(e) => set("top_logprobs", e.target.value)} errors={errors} hint="Listed per token, for KL." />
          <InputField label="Request timeout (s)" name="request_timeout" type="number" min={1} value={form.request_timeout} onChange={(e) => set("request_timeout", e.target.value)} errors={errors} />
        </div>
        <FormErrors error={error} fields={FIELDS} />
        <div className="form-actions">
          <button type="button" className="btn" onClick={close} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            Start run
          </button>
        </div>
      </form>
    </Dialog>
  );
}
