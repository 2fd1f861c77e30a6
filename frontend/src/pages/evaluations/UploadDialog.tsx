import { useState, type FormEvent } from "react";
import { api, ApiError } from "../../api/client";
import type { EvalSuite, EvalSuiteVersion, LineError, UploadRefused } from "../../api/types";
import { Dialog } from "../../components/Dialog";
import { Field, FormErrors, InputField, TextareaField } from "../../components/Field";
import { useFormState } from "../../hooks/useFormState";

/** The line-numbered problems of a refused upload (the API's 400 body), or none for any other error. */
export function refusedLines(error: unknown): LineError[] {
  if (!(error instanceof ApiError) || error.status !== 400) return [];
  const body = error.body as Partial<UploadRefused> | null;
  return Array.isArray(body?.errors) ? body.errors : [];
}

export function LineErrors({ lines }: { lines: LineError[] }) {
  if (!lines.length) return null;
  return (
    <div className="notice notice-bad" role="alert" data-testid="upload-line-errors">
      <strong>Nothing was imported.</strong> Fix {lines.length === 1 ? "this line" : `these ${lines.length} problems`} and upload the
      file again:
      <ul className="line-errors">
        {lines.map((e, index) => (
          <li key={index} data-line={e.line}>
            <span className="line-no">{e.line ? `line ${e.line}` : "file"}</span>
            <span>{e.message}</span>
          </li>
        ))}
      </ul>
    </div>
  );
}

interface UploadDialogProps {
  open: boolean;
  /** Upload a new version of this suite; without it, the dialog creates a new suite from the file. */
  suite?: EvalSuite;
  onClose: () => void;
  onSuite?: (suite: EvalSuite) => void;
  onVersion?: (version: EvalSuiteVersion) => void;
}

/** A JSONL file as a new suite (POST /api/eval-suites/import/) or as a suite's next version (…/upload/).
 *  The API refuses a file with any bad line whole; its line-numbered problems are listed here. */
export function UploadDialog({ open, suite, onClose, onSuite, onVersion }: UploadDialogProps) {
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [note, setNote] = useState("");
  const [file, setFile] = useState<File | null>(null);
  const [inputKey, setInputKey] = useState(0);
  const { error, busy, run, clearError, errors } = useFormState();
  const lines = refusedLines(error);

  const close = () => {
    setName("");
    setDescription("");
    setNote("");
    setFile(null);
    setInputKey((k) => k + 1);
    clearError();
    onClose();
  };

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      const form = new FormData();
      if (file) form.append("file", file, file.name);
      form.append("note", note);
      if (suite) {
        const version = await api.postForm<EvalSuiteVersion>(`/api/eval-suites/${suite.id}/upload/`, form);
        close();
        onVersion?.(version);
      } else {
        form.append("name", name);
        form.append("description", description);
        const created = await api.postForm<EvalSuite>("/api/eval-suites/import/", form);
        close();
        onSuite?.(created);
      }
    });
  };

  const lineFields = Object.keys(errors ?? {}).filter((key) => key.startsWith("errors."));
  // A refused file's summary ("4 problem(s): line 2 …") repeats the list below: show the list alone.
  const fieldErrors = lines.length ? Object.fromEntries(Object.entries(errors ?? {}).filter(([key]) => key !== "file" && key !== "jsonl")) : errors;
  return (
    <Dialog title={suite ? `Upload a new version of ${suite.name}` : "Upload a suite"} open={open} onClose={close} testId="upload-suite-dialog" wide>
      <form onSubmit={submit} noValidate>
        <p className="muted">
          One case per line, e.g. <code>{'{"id": "q1", "prompt": "2 + 3?", "expected": "5", "match_rule": "numeric", "tags": ["math"]}'}</code>.
          A file with any bad line is refused whole.
        </p>
        {!suite && (
          <>
            <InputField label="Suite name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} autoFocus required />
            <TextareaField label="Description" name="description" value={description} onChange={(e) => setDescription(e.target.value)} errors={errors} rows={2} />
          </>
        )}
        <Field label="JSONL file" name="file" errors={fieldErrors} hint="UTF-8, up to 10 MiB and 10,000 cases.">
          {(props) => (
            <input
              {...props}
              key={inputKey}
              type="file"
              accept=".jsonl,.ndjson,.json,.txt,application/x-ndjson,application/jsonl"
              onChange={(e) => {
                setFile(e.target.files?.[0] ?? null);
                clearError();
              }}
            />
          )}
        </Field>
        <InputField label="Version note" name="note" value={note} onChange={(e) => setNote(e.target.value)} errors={errors} placeholder="What changed (optional)" />
        <LineErrors lines={lines} />
        {!lines.length && <FormErrors error={error} fields={["name", "description", "file", "jsonl", "note", ...lineFields]} />}
        <div className="form-actions">
          <button type="button" className="btn" onClick={close} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy || !file}>
            {busy ? "Uploading…" : "Upload"}
          </button>
        </div>
      </form>
    </Dialog>
  );
}
