import { useRef, useState, type FormEvent } from "react";
import { api, type FieldErrors } from "../../api/client";
import type { ApiKey, ApiKeyCreated, ScopeAliases } from "../../api/types";
import { Dialog } from "../../components/Dialog";
import { CheckboxField, FormErrors, InputField } from "../../components/Field";
import { isoToLocalInput, localInputToIso } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useFormState } from "../../hooks/useFormState";
import { QuotaInputs, quotaBody, quotaDraft, quotaFieldNames } from "./quota";
import "./tenants.css";

/** What a key may call: every alias (also ones added later), or only the aliases picked. */
export interface ScopeDraft {
  only: boolean;
  aliases: string[];
}

function scopeDraft(scopes: string[] | undefined): ScopeDraft {
  return { only: Boolean(scopes?.length), aliases: [...(scopes ?? [])] };
}

/** Draft -> the API's `scopes`: empty means every alias. Picking "only" with none ticked is refused here,
 * since the API would read the empty list as "every alias". */
function scopesBody(draft: ScopeDraft): string[] {
  if (!draft.only) return [];
  if (draft.aliases.length === 0) throw new Error("Tick at least one model, or choose every model.");
  return draft.aliases;
}

/** Every model, or a ticked list of the aliases the proxy can route (GET /api/keys/scope-aliases/). */
function ScopePicker({ draft, onChange, errors }: { draft: ScopeDraft; onChange: (draft: ScopeDraft) => void; errors: FieldErrors | undefined }) {
  const known = useApi<ScopeAliases>("/api/keys/scope-aliases/");
  // A key may keep a scope whose alias is gone since: it stays listed (and ticked) until unticked.
  const names = [...new Set([...(known.data?.aliases ?? []), ...draft.aliases])].sort();
  const messages = errors?.["scopes"] ?? [];
  const toggle = (name: string, on: boolean) =>
    onChange({ ...draft, aliases: on ? [...draft.aliases, name].sort() : draft.aliases.filter((a) => a !== name) });
  return (
    <fieldset className={messages.length ? "scope-picker field-invalid" : "scope-picker"} data-testid="scope-picker">
      <legend>Models this key may call</legend>
      <label>
        <input type="radio" name="scope-mode" checked={!draft.only} onChange={() => onChange({ ...draft, only: false })} /> Every model, including
        ones added later
      </label>
      <label>
        <input type="radio" name="scope-mode" checked={draft.only} onChange={() => onChange({ ...draft, only: true })} /> Only the models ticked
      </label>
      {draft.only && (
        <div className="scope-aliases" role="group" aria-label="Models">
          {known.loading && !known.data && <span className="muted">Loading models…</span>}
          {!known.loading && names.length === 0 && <span className="muted">No models yet: add an alias first.</span>}
          {names.map((name) => (
            <label key={name}>
              <input type="checkbox" checked={draft.aliases.includes(name)} onChange={(e) => toggle(name, e.target.checked)} /> {name}
              {known.data && !known.data.aliases.includes(name) && <span className="muted"> (no longer exists)</span>}
            </label>
          ))}
        </div>
      )}
      {messages.length > 0 && (
        <div className="field-error" role="alert">
          {messages.join(" ")}
        </div>
      )}
    </fieldset>
  );
}

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
  const [scope, setScope] = useState<ScopeDraft>(() => scopeDraft([]));
  const [expires, setExpires] = useState("");
  const { error, busy, run, clearError, errors } = useFormState();

  const reset = () => {
    setName("");
    setScope(scopeDraft([]));
    setExpires("");
    clearError();
  };

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      const body: Record<string, unknown> = { tenant: tenantId, name, scopes: scopesBody(scope) };
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
        <ScopePicker draft={scope} onChange={setScope} errors={errors} />
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

/** Rename a key, change its scopes or expiry, or give it its own quota instead of the tenant's. */
export function EditKeyDialog({ apiKey, onClose, onSaved }: { apiKey: ApiKey | null; onClose: () => void; onSaved: () => void }) {
  return apiKey ? <EditKeyForm key={apiKey.id} apiKey={apiKey} onClose={onClose} onSaved={onSaved} /> : null;
}

function EditKeyForm({ apiKey, onClose, onSaved }: { apiKey: ApiKey; onClose: () => void; onSaved: () => void }) {
  const [name, setName] = useState(apiKey.name);
  const [scope, setScope] = useState<ScopeDraft>(() => scopeDraft(apiKey.scopes));
  const [expires, setExpires] = useState(isoToLocalInput(apiKey.expires_at));
  const [override, setOverride] = useState(Boolean(apiKey.quota_override));
  const [quota, setQuota] = useState(() => quotaDraft(apiKey.quota_override));
  const { error, busy, run, errors } = useFormState();

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      const body: Record<string, unknown> = {
        name,
        scopes: scopesBody(scope),
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
        <div className="grid-2">
          <InputField label="Name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} />
          <InputField label="Expires" name="expires_at" type="datetime-local" value={expires} onChange={(e) => setExpires(e.target.value)} errors={errors} />
        </div>
        <ScopePicker draft={scope} onChange={setScope} errors={errors} />
        <CheckboxField
          label="Own quota for this key (instead of the tenant's)"
          name="quota_override"
          checked={override}
          onChange={(e) => setOverride(e.target.checked)}
          errors={errors}
        />
        {override && <QuotaInputs draft={quota} onChange={setQuota} prefix="quota_override" errors={errors} />}
        <FormErrors error={error} fields={["name", "scopes", "expires_at", "quota_override", ...quotaFieldNames("quota_override")]} />
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
