import { useState, type FormEvent } from "react";
import { api, ApiError } from "../../api/client";
import type { EvalCase, EvalCaseRequest, MatchRule } from "../../api/types";
import { Dialog } from "../../components/Dialog";
import { FormErrors, InputField, SelectField, TextareaField } from "../../components/Field";
import { useFormState } from "../../hooks/useFormState";

/** The match rules, as the API's schema lists them, with what each compares (docs/evaluations.md). */
export const MATCH_RULES: ReadonlyArray<{ value: MatchRule; label: string }> = [
  { value: "exact", label: "exact: the whole output, outer spaces ignored" },
  { value: "normalized", label: "normalized: case, punctuation, articles and spacing ignored" },
  { value: "regex", label: "regex: a Python pattern found in the output" },
  { value: "numeric", label: "numeric: the last number in the output" },
  { value: "choice", label: "choice: the option letter the output picks" },
];

type Kind = "prompt" | "messages";

interface CaseDialogProps {
  versionId: number;
  /** The case to edit; null adds a new one at the end of the version. */
  edit: EvalCase | null;
  open: boolean;
  onClose: () => void;
  onSaved: () => void;
}

/** Add or edit one case of a draft version; the API checks it with the same rules as a JSONL line. */
export function CaseDialog({ versionId, edit, open, onClose, onSaved }: CaseDialogProps) {
  const [form, setForm] = useState(() => initial(edit));
  const { error, busy, run, clearError, errors } = useFormState();
  const set = (name: keyof ReturnType<typeof initial>, value: string) => setForm((f) => ({ ...f, [name]: value }));

  const close = () => {
    clearError();
    onClose();
  };

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      let messages: EvalCaseRequest["messages"] = null;
      if (form.kind === "messages") {
        try {
          messages = JSON.parse(form.messages) as EvalCaseRequest["messages"];
        } catch (err) {
          throw new ApiError(400, "Please correct the errors below.", { messages: [`Not valid JSON: ${(err as Error).message}`] });
        }
      }
      const expected = form.expected.trim() === "" ? null : form.expected;
      const body: EvalCaseRequest = {
        version: versionId,
        case_id: form.case_id,
        prompt: form.kind === "prompt" ? form.prompt : "",
        messages,
        expected,
        // An empty rule with an answer goes to the API as null, which says on the field what is missing.
        match_rule: expected === null ? null : ((form.match_rule || null) as MatchRule | null),
        tags: form.tags
          .split(",")
          .map((t) => t.trim())
          .filter(Boolean),
      };
      if (edit) await api.patch<EvalCase>(`/api/eval-cases/${edit.id}/`, body);
      else await api.post<EvalCase>("/api/eval-cases/", body);
      onSaved();
      close();
    });
  };

  return (
    <Dialog title={edit ? `Edit case ${edit.case_id}` : "Add a case"} open={open} onClose={close} testId="case-dialog" wide>
      <form onSubmit={submit} noValidate>
        <InputField label="Case id" name="case_id" value={form.case_id} onChange={(e) => set("case_id", e.target.value)} errors={errors} required autoFocus />
        <SelectField
          label="Asks with"
          name="kind"
          value={form.kind}
          onChange={(e) => set("kind", e.target.value)}
          options={[
            { value: "prompt", label: "a prompt (sent as one user message)" },
            { value: "messages", label: "a list of chat messages" },
          ]}
        />
        {form.kind === "prompt" ? (
          <TextareaField label="Prompt" name="prompt" value={form.prompt} onChange={(e) => set("prompt", e.target.value)} errors={errors} rows={3} />
        ) : (
          <TextareaField
            label="Messages (JSON)"
            name="messages"
            className="code"
            value={form.messages}
            onChange={(e) => set("messages", e.target.value)}
            errors={errors}
            rows={5}
            hint='[{"role": "system", "content": "…"}, {"role": "user", "content": "…"}]: the last one is a user message.'
          />
        )}
        <div className="form-row">
          <InputField label="Expected answer" name="expected" value={form.expected} onChange={(e) => set("expected", e.target.value)} errors={errors} hint="Optional." />
          <SelectField
            label="Match rule"
            name="match_rule"
            value={form.match_rule}
            onChange={(e) => set("match_rule", e.target.value)}
            errors={errors}
            options={[{ value: "", label: "none" }, ...MATCH_RULES.map((r) => ({ value: r.value, label: r.label }))]}
          />
          <InputField label="Tags" name="tags" value={form.tags} onChange={(e) => set("tags", e.target.value)} errors={errors} hint="Comma-separated." />
        </div>
        <FormErrors error={error} fields={["case_id", "prompt", "messages", "expected", "match_rule", "tags"]} />
        <div className="form-actions">
          <button type="button" className="btn" onClick={close} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            {edit ? "Save case" : "Add case"}
          </button>
        </div>
      </form>
    </Dialog>
  );
}

function initial(edit: EvalCase | null) {
  return {
    case_id: edit?.case_id ?? "",
    kind: (edit?.messages ? "messages" : "prompt") as Kind,
    prompt: edit?.prompt ?? "",
    messages: edit?.messages ? JSON.stringify(edit.messages, null, 2) : '[{"role": "user", "content": ""}]',
    expected: edit?.expected ?? "",
    match_rule: edit?.match_rule ?? "",
    tags: (edit?.tags ?? []).join(", "),
  };
}
