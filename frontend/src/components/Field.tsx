import { useEffect, useId, useRef, useState, type InputHTMLAttributes, type ReactNode, type SelectHTMLAttributes, type TextareaHTMLAttributes } from "react";
import type { ApiError, FieldErrors } from "../api/client";

interface FieldProps {
  label: string;
  /** Dotted path of the field in the API body, used to pick its errors ("quota.tokens_per_minute"). */
  name: string;
  errors?: FieldErrors;
  hint?: ReactNode;
  children: (props: { id: string; name: string; "aria-invalid": boolean; "aria-describedby"?: string }) => ReactNode;
}

/** A labelled form control with its hint and its DRF field errors underneath. */
export function Field({ label, name, errors, hint, children }: FieldProps) {
  const id = useId();
  const messages = errors?.[name] ?? [];
  const describedBy = messages.length ? `${id}-error` : hint ? `${id}-hint` : undefined;
  return (
    <div className={messages.length ? "field field-invalid" : "field"}>
      <label htmlFor={id}>{label}</label>
      {children({ id, name, "aria-invalid": messages.length > 0, "aria-describedby": describedBy })}
      {hint && !messages.length && (
        <div className="field-hint" id={`${id}-hint`}>
          {hint}
        </div>
      )}
      {messages.length > 0 && (
        <div className="field-error" id={`${id}-error`} role="alert">
          {messages.join(" ")}
        </div>
      )}
    </div>
  );
}

type InputFieldProps = Omit<InputHTMLAttributes<HTMLInputElement>, "name"> & {
  label: string;
  name: string;
  errors?: FieldErrors;
  hint?: ReactNode;
};

export function InputField({ label, name, errors, hint, ...input }: InputFieldProps) {
  return (
    <Field label={label} name={name} errors={errors} hint={hint}>
      {(props) => <input {...input} {...props} />}
    </Field>
  );
}

type TextareaFieldProps = Omit<TextareaHTMLAttributes<HTMLTextAreaElement>, "name"> & {
  label: string;
  name: string;
  errors?: FieldErrors;
  hint?: ReactNode;
};

export function TextareaField({ label, name, errors, hint, ...textarea }: TextareaFieldProps) {
  return (
    <Field label={label} name={name} errors={errors} hint={hint}>
      {(props) => <textarea {...textarea} {...props} />}
    </Field>
  );
}

type SelectFieldProps = Omit<SelectHTMLAttributes<HTMLSelectElement>, "name"> & {
  label: string;
  name: string;
  errors?: FieldErrors;
  hint?: ReactNode;
  options: ReadonlyArray<{ value: string; label: string }>;
};

export function SelectField({ label, name, errors, hint, options, ...select }: SelectFieldProps) {
  return (
    <Field label={label} name={name} errors={errors} hint={hint}>
      {(props) => (
        <select {...select} {...props}>
          {options.map((option) => (
            <option key={option.value} value={option.value}>
              {option.label}
            </option>
          ))}
        </select>
      )}
    </Field>
  );
}

type CheckboxFieldProps = Omit<InputHTMLAttributes<HTMLInputElement>, "name" | "type"> & {
  label: string;
  name: string;
  errors?: FieldErrors;
  hint?: ReactNode;
};

export function CheckboxField({ label, name, errors, hint, ...input }: CheckboxFieldProps) {
  const id = useId();
  const messages = errors?.[name] ?? [];
  return (
    <div className={messages.length ? "field field-check field-invalid" : "field field-check"}>
      <label htmlFor={id}>
        <input type="checkbox" id={id} name={name} {...input} /> {label}
      </label>
      {hint && <div className="field-hint">{hint}</div>}
      {messages.length > 0 && (
        <div className="field-error" role="alert">
          {messages.join(" ")}
        </div>
      )}
    </div>
  );
}

/** Errors that belong to no field (and the message of non-400 errors), above the form's buttons. */
export function FormErrors({ error, fields = [] }: { error: ApiError | Error | null; fields?: string[] }) {
  if (!error) return null;
  const apiError = "fieldErrors" in error ? error : null;
  let messages: string[] = apiError ? apiError.generalErrors : [error.message];
  if (apiError) {
    // Errors on fields the form does not show (e.g. a server-side check) must still be visible.
    const shown = new Set([...fields, "non_field_errors", "detail"]);
    for (const [name, errs] of Object.entries(apiError.fieldErrors)) {
      if (!shown.has(name)) messages = [...messages, `${name}: ${errs.join(" ")}`];
    }
  }
  if (!messages.length && apiError) messages = ["Please correct the highlighted fields."];
  return (
    <div className="form-error" role="alert">
      {messages.map((message) => (
        <div key={message}>{message}</div>
      ))}
    </div>
  );
}

type DebouncedInputFieldProps = Omit<InputFieldProps, "value" | "onChange" | "defaultValue"> & {
  /** The committed value (e.g. from the URL); read when the field mounts. Remount it (key) to reset. */
  value: string;
  /** Called with the trimmed text once typing pauses for `delayMs`. */
  onCommit: (value: string) => void;
  delayMs?: number;
};

/** A text filter that asks the API once the user pauses typing, not on every keystroke. */
export function DebouncedInputField({ value, onCommit, delayMs = 300, ...props }: DebouncedInputFieldProps) {
  const [draft, setDraft] = useState(value);
  const commit = useRef(onCommit);
  commit.current = onCommit;
  const committed = useRef(value);

  useEffect(() => {
    const text = draft.trim();
    if (text === committed.current) return;
    const timer = setTimeout(() => {
      committed.current = text;
      commit.current(text);
    }, delayMs);
    return () => clearTimeout(timer);
  }, [draft, delayMs]);

  return <InputField {...props} value={draft} onChange={(e) => setDraft(e.target.value)} />;
}
