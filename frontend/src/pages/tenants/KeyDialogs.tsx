import { useRef, useState, type FormEvent } from "react";
import { api, ApiError } from "../../api/client";
import type { ApiKeyCreated } from "../../api/types";
import { Dialog } from "../../components/Dialog";
import { FormErrors, InputField } from "../../components/Field";
import { localInputToIso } from "../../format";

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
  const [error, setError] = useState<ApiError | Error | null>(null);
  const [busy, setBusy] = useState(false);

  const reset = () => {
    setName("");
    setScopes("");
    setExpires("");
    setError(null);
  };

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
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
    } catch (err) {
      setError(err instanceof Error ? err : new Error(String(err)));
    } finally {
      setBusy(false);
    }
  };

  const errors = error instanceof ApiError ? error.fieldErrors : undefined;
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
