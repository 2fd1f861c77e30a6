// A quota as a form: one box per limit, empty for no limit; shared by the tenant's quota card, the
// create-tenant dialog and a key's own quota.
import type { CSSProperties } from "react";
import { QUOTA_FIELDS, type Quota } from "../../api/types";
import type { FieldErrors } from "../../api/client";
import { InputField } from "../../components/Field";

export type QuotaDraft = Record<keyof Quota, string>;

/** Empty boxes for unset limits. */
export function quotaDraft(quota: Quota | null | undefined): QuotaDraft {
  const draft = {} as QuotaDraft;
  for (const { name } of QUOTA_FIELDS) {
    const value = quota?.[name];
    draft[name] = value === null || value === undefined ? "" : String(value);
  }
  return draft;
}

/** Draft -> API body: empty is null (no limit); digits are numbers; anything else is sent as typed so the
 * API can say what is wrong next to the field. */
export function quotaBody(draft: QuotaDraft): Record<string, number | string | null> {
  const body: Record<string, number | string | null> = {};
  for (const { name } of QUOTA_FIELDS) {
    const raw = draft[name].trim();
    body[name] = raw === "" ? null : /^\d+$/.test(raw) ? Number(raw) : raw;
  }
  return body;
}

/** The limit boxes; `prefix` is the quota's field in the API body ("quota", "quota_override"). */
export function QuotaInputs({
  draft,
  onChange,
  prefix,
  errors,
  className = "grid-3",
  style,
}: {
  draft: QuotaDraft;
  onChange: (draft: QuotaDraft) => void;
  prefix: string;
  errors: FieldErrors | undefined;
  className?: string;
  style?: CSSProperties;
}) {
  return (
    <div className={className} style={style}>
      {QUOTA_FIELDS.map(({ name, label, hint }) => (
        <InputField
          key={name}
          label={label}
          name={`${prefix}.${name}`}
          inputMode="numeric"
          placeholder="unlimited"
          hint={hint}
          value={draft[name]}
          onChange={(e) => onChange({ ...draft, [name]: e.target.value })}
          errors={errors}
        />
      ))}
    </div>
  );
}

/** The dotted names of a quota's fields, for FormErrors. */
export function quotaFieldNames(prefix: string): string[] {
  return QUOTA_FIELDS.map(({ name }) => `${prefix}.${name}`);
}
