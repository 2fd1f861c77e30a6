import { useRef, useState, type FormEvent } from "react";
import { api } from "../../api/client";
import { QUOTA_FIELDS, type ApiKey, type ApiKeyCreated, type Quota } from "../../api/types";
import { Dialog } from "../../components/Dialog";
import { CheckboxField, FormErrors, InputField } from "../../components/Field";
import { isoToLocalInput, localInputToIso } from "../../format";
import { useFormState } from "../../hooks/useFormState";

/** Name, scopes and expiry of a new key; the API answers with the secret, passed up once. */
export function CreateKeyDialog({
  open,
  tenantId,
  onClose,
  onCreated,
}: {
  open: boolean;
  tenantId: number;
  onClose: () => void;
  onCreated: (created: ApiKeyCreated) => void;
}) {
  const [name, setName] = useState("");
  const [scopes, setScopes] = useState("");
  const [expires, setExpires] = useState("");
  const { error, busy, run, clearError, errors } = useFormState();

  const reset = () => {
    setName("");
    setScopes("");
    setExpires("");
    clearError();
  };

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      const body: Record<string, unknown> = {
        tenant: tenantId,
        name,
        scopes: scopes
          .split(",")
          .map((s) => s.trim())
          .filter(Boolean),
      };
      if (expires) body["expires_at"] = localInputToIso(expires);
      const created = await api.post<ApiKeyCreated>("/api/keys/", body);
      reset();
      onCreated(created);
    });
  };

  return (
    <Dialog
      title="Create API key"
      open={open}
      onClose={() => {
        reset();
        onClose();
      }}
      testId="create-key-dialog"
    >
      <form onSubmit={submit} noValidate>
        <InputField label="Name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} autoFocus placeholder="e.g. production backend" />
        <InputField
          label="Scopes"
          name="scopes"
          value={scopes}
          onChange={(e) => setScopes(e.target.value)}
          errors={errors}
          placeholder="all models"
          hint="Model aliases this key may call, comma-separated; empty for all."
        />
        <InputField label="Expires" name="expires_at" type="datetime-local" value={expires} onChange={(e) => setExpires(e.target.value)} errors={errors} hint="Empty: never." />
        <FormErrors error={error} fields={["name", "scopes", "expires_at", "tenant"]} />
        <div className="form-actions">
          <button
            type="button"
            className="btn"
            onClick={() => {
              reset();
              onClose();
            }}
            disabled={busy}
          >
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            Create key
          </button>
        </div>
      </form>
    </Dialog>
  );
}

/** Shows a new key's secret exactly once. Escape does not close it; only the explicit button does. */
export function NewKeySecretDialog({ secret, onClose }: { secret: { name: string; key: string } | null; onClose: () => void }) {
  const input = useRef<HTMLInputElement>(null);
  const [copied, setCopied] = useState(false);

  const copy = async () => {
    if (!secret) return;
    try {
      await navigator.clipboard.writeText(secret.key);
    } catch {
      // No clipboard permission (plain http on another host): select it so Ctrl+C works.
      input.current?.select();
      document.execCommand("copy");
    }
    setCopied(true);
  };

  return (
    <Dialog
      title={`Key "${secret?.name ?? ""}" created`}
      open={secret !== null}
      dismissable={false}
      onClose={() => {
        setCopied(false);
        onClose();
      }}
      testId="new-key-dialog"
      footer={
        <button
          type="button"
          className="btn btn-primary"
          onClick={() => {
            setCopied(false);
            onClose();
          }}
        >
          I have stored the key
        </button>
      }
    >
      <div className="notice notice-warn">
        Copy this key now. It is shown only once: the console stores only a hash and cannot show it again.
      </div>
      <div className="secret-box">
        <input ref={input} readOnly value={secret?.key ?? ""} data-testid="new-key-secret" aria-label="API key" onFocus={(e) => e.target.select()} />
        <button type="button" className="btn" onClick={() => void copy()}>
          {copied ? "Copied" : "Copy"}
        </button>
      </div>
      <p className="muted">
        Use it as <code>Authorization: Bearer &lt;key&gt;</code> on <code>/v1/</code>.
      </p>
    </Dialog>
  );
}

type QuotaDraft = Record<keyof Quota, string>;

/** Empty boxes for unset limits; the tenant's quota applies where a key has no override. */
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

/** Rename a key, change its scopes or expiry, or give it its own quota instead of the tenant's. */
export function EditKeyDialog({ apiKey, onClose, onSaved }: { apiKey: ApiKey | null; onClose: () => void; onSaved: () => void }) {
  return apiKey ? <EditKeyForm key={apiKey.id} apiKey={apiKey} onClose={onClose} onSaved={onSaved} /> : null;
}

function EditKeyForm({ apiKey, onClose, onSaved }: { apiKey: ApiKey; onClose: () => void; onSaved: () => void }) {
  const [name, setName] = useState(apiKey.name);
  const [scopes, setScopes] = useState((apiKey.scopes ?? []).join(", "));
  const [expires, setExpires] = useState(isoToLocalInput(apiKey.expires_at));
  const [override, setOverride] = useState(Boolean(apiKey.quota_override));
  const [quota, setQuota] = useState(() => quotaDraft(apiKey.quota_override));
  const { error, busy, run, errors } = useFormState();

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      const body: Record<string, unknown> = {
        name,
        scopes: scopes
          .split(",")
          .map((s) => s.trim())
          .filter(Boolean),
        quota_override: override ? quotaBody(quota) : null,
      };
      // Only a changed expiry is sent: the API refuses past dates, and an old one may be past by now.
      if (expires !== isoToLocalInput(apiKey.expires_at)) body["expires_at"] = expires ? localInputToIso(expires) : null;
      await api.patch<ApiKey>(`/api/keys/${apiKey.id}/`, body);
      onSaved();
    });
  };

  return (
    <Dialog title={`Edit key ${apiKey.name}`} open onClose={onClose} testId="edit-key-dialog" wide>
      <form onSubmit={submit} noValidate>
        <div className="grid-3">
          <InputField label="Name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} />
          <InputField label="Scopes" name="scopes" value={scopes} onChange={(e) => setScopes(e.target.value)} errors={errors} placeholder="all models" />
          <InputField label="Expires" name="expires_at" type="datetime-local" value={expires} onChange={(e) => setExpires(e.target.value)} errors={errors} />
        </div>
        <CheckboxField
          label="Own quota for this key (instead of the tenant's)"
          name="quota_override"
          checked={override}
          onChange={(e) => setOverride(e.target.checked)}
          errors={errors}
        />
        {override && (
          <div className="grid-3">
            {QUOTA_FIELDS.map(({ name: field, label, hint }) => (
              <InputField
                key={field}
                label={label}
                name={`quota_override.${field}`}
                inputMode="numeric"
                placeholder="unlimited"
                hint={hint}
                value={quota[field]}
                onChange={(e) => setQuota({ ...quota, [field]: e.target.value })}
                errors={errors}
              />
            ))}
          </div>
        )}
        <FormErrors
          error={error}
          fields={["name", "scopes", "expires_at", "quota_override", ...QUOTA_FIELDS.map(({ name: f }) => `quota_override.${f}`)]}
        />
        <div className="form-actions">
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" className="btn btn-primary" disabled={busy}>
            Save key
          </button>
        </div>
      </form>
    </Dialog>
  );
}
