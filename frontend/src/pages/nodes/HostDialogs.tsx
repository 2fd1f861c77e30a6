// Registering a host and managing its agent token: the token is shown once (on register and rotate),
// the console keeps only its hash and prefix; revoking it refuses the agent's next call.
import { useRef, useState, type FormEvent } from "react";
import { ApiError, api, errorMessage, type FieldErrors } from "../../api/client";
import type { Host } from "../../api/types";
import { ConfirmDialog, Dialog } from "../../components/Dialog";
import { InputField } from "../../components/Field";

/** The form that registers a host; on success the parent shows its token once. */
export function AddHostDialog({ open, onClose, onCreated }: { open: boolean; onClose: () => void; onCreated: (host: Host) => void }) {
  const [name, setName] = useState("");
  const [address, setAddress] = useState("");
  const [role, setRole] = useState("");
  const [errors, setErrors] = useState<FieldErrors>({});
  const [busy, setBusy] = useState(false);

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setErrors({});
    try {
      const host = await api.post<Host>("/api/hosts/", { name, address: address || "127.0.0.1", role });
      setName("");
      setAddress("");
      setRole("");
      onCreated(host);
    } catch (error) {
      setErrors(error instanceof ApiError ? error.fieldErrors : { non_field_errors: [errorMessage(error)] });
    } finally {
      setBusy(false);
    }
  };

  return (
    <Dialog
      title="Register a host"
      open={open}
      onClose={onClose}
      testId="add-host-dialog"
      footer={
        <>
          <button type="button" className="btn" onClick={onClose} disabled={busy}>
            Cancel
          </button>
          <button type="submit" form="add-host-form" className="btn btn-primary" disabled={busy} data-testid="add-host-submit">
            Register
          </button>
        </>
      }
    >
      <form id="add-host-form" onSubmit={(e) => void submit(e)}>
        <InputField label="Name" name="name" errors={errors} value={name} onChange={(e) => setName(e.target.value)} hint="Lowercase letters, digits and hyphens; the agent runs with --host NAME." required />
        <InputField label="Address" name="address" errors={errors} value={address} onChange={(e) => setAddress(e.target.value)} hint="Where the proxy reaches its engines (IP or DNS name)." placeholder="127.0.0.1" />
        <InputField label="Role" name="role" errors={errors} value={role} onChange={(e) => setRole(e.target.value)} />
        {errors.non_field_errors && <p className="form-error" role="alert">{errors.non_field_errors.join(" ")}</p>}
      </form>
    </Dialog>
  );
}

/** Shows a host's new agent token exactly once, with how to give it to the agent. */
export function AgentTokenDialog({ host, onClose }: { host: Host | null; onClose: () => void }) {
  const input = useRef<HTMLInputElement>(null);
  const [copied, setCopied] = useState(false);
  const token = host?.new_agent_token ?? "";

  const copy = async () => {
    try {
      await navigator.clipboard.writeText(token);
    } catch {
      input.current?.select();
      document.execCommand("copy");
    }
    setCopied(true);
  };
  const close = () => {
    setCopied(false);
    onClose();
  };

  return (
    <Dialog
      title={`Agent token of ${host?.name ?? ""}`}
      open={host !== null && token !== ""}
      dismissable={false}
      onClose={close}
      testId="agent-token-dialog"
      footer={
        <button type="button" className="btn btn-primary" onClick={close}>
          I have stored the token
        </button>
      }
    >
      <div className="notice notice-warn">
        Copy this token now. It is shown only once: the console stores only a hash and cannot show it again.
      </div>
      <div className="secret-box">
        <input ref={input} readOnly value={token} data-testid="agent-token-secret" aria-label="Agent token" onFocus={(e) => e.target.select()} />
        <button type="button" className="btn" onClick={() => void copy()}>
          {copied ? "Copied" : "Copy"}
        </button>
      </div>
      <p className="muted">
        On the host, put it in a file only the agent's user can read (<code>chmod 600</code>) and start{" "}
        <code>python -m nodes.agent --host {host?.name} --control-plane URL --token-file FILE</code>, or pass it in{" "}
        <code>INFERCHAIN_AGENT_TOKEN</code>. Never on the command line.
      </p>
    </Dialog>
  );
}

/** Rotate / revoke buttons for one host's token, each behind a confirmation. */
export function AgentTokenActions({ host, onRotated, onChanged }: { host: Host; onRotated: (host: Host) => void; onChanged: () => void }) {
  const [confirm, setConfirm] = useState<"rotate" | "revoke" | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  const act = async () => {
    setBusy(true);
    setError(null);
    try {
      const updated = await api.post<Host>(`/api/hosts/${host.id}/${confirm === "rotate" ? "rotate" : "revoke"}-agent-token/`);
      setConfirm(null);
      if (confirm === "rotate") onRotated(updated);
      onChanged();
    } catch (e) {
      setError(errorMessage(e));
    } finally {
      setBusy(false);
    }
  };

  return (
    <>
      <button type="button" className="btn btn-small" onClick={() => setConfirm("rotate")} data-testid={`rotate-token-${host.name}`}>
        {host.agent_token ? "Rotate token" : "New token"}
      </button>
      {host.agent_token && (
        <button type="button" className="btn btn-small btn-danger" onClick={() => setConfirm("revoke")} data-testid={`revoke-token-${host.name}`}>
          Revoke token
        </button>
      )}
      <ConfirmDialog
        title={confirm === "rotate" ? `New agent token for ${host.name}` : `Revoke the agent token of ${host.name}`}
        open={confirm !== null}
        message={
          confirm === "rotate"
            ? "The current token stops working at once; give the agent the new one. Its engines keep serving meanwhile."
            : "Its agent is refused from its next call until it gets a new token. Its engines keep serving."
        }
        confirmLabel={confirm === "rotate" ? "Issue a new token" : "Revoke"}
        danger={confirm === "revoke"}
        busy={busy}
        error={error}
        onConfirm={() => void act()}
        onClose={() => setConfirm(null)}
      />
    </>
  );
}
