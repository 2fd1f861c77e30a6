import { useEffect, useState, type FormEvent } from "react";
import { Link, useNavigate, useParams } from "react-router-dom";
import { api, errorMessage } from "../../api/client";
import { QUOTA_FIELDS, type Page as ApiPage, type ApiKey, type Tenant } from "../../api/types";
import { useAuth } from "../../auth";
import { TenantUsageCard } from "../../components/Cost";
import { ConfirmDialog } from "../../components/Dialog";
import { CheckboxField, FormErrors, InputField, TextareaField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatDateTime, formatNumber, formatShortDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useFormState } from "../../hooks/useFormState";
import { TenantHistory } from "./TenantHistory";
import { CreateKeyDialog, EditKeyDialog, NewKeySecretDialog } from "./KeyDialogs";
import { QuotaInputs, quotaBody, quotaDraft, quotaFieldNames } from "./quota";

/** One tenant: its settings, its quota and its API keys (create with a copy-once secret, revoke). */
export function TenantDetailPage() {
  const { id } = useParams();
  const { isAdmin } = useAuth();
  const navigate = useNavigate();
  const tenant = useApi<Tenant>(`/api/tenants/${id}/`);
  const [deleting, setDeleting] = useState(false);
  const [deleteError, setDeleteError] = useState<string | null>(null);

  if (tenant.error) {
    return (
      <Page title="Tenant" subtitle={<Link to="/tenants">← Tenants</Link>}>
        <ErrorState error={tenant.error} onRetry={tenant.reload} />
      </Page>
    );
  }
  if (!tenant.data) return <Page title="Tenant">Loading…</Page>;
  const t = tenant.data;

  const remove = async () => {
    try {
      await api.delete(`/api/tenants/${t.id}/`);
      navigate("/tenants");
    } catch (err) {
      setDeleteError(errorMessage(err));
    }
  };

  return (
    <Page
      title={
        <>
          {t.name} <StatusBadge status={t.is_active ? "active" : "inactive"} />
        </>
      }
      subtitle={<Link to="/tenants">← Tenants</Link>}
      actions={
        isAdmin && (
          <button type="button" className="btn btn-danger" onClick={() => setDeleting(true)}>
            Delete tenant
          </button>
        )
      }
    >
      <div className="grid-2">
        {/* Keyed by tenant: the forms hold drafts that must not carry over to another tenant. */}
        <TenantSettingsCard key={`settings-${t.id}`} tenant={t} editable={isAdmin} onSaved={tenant.reload} />
        <QuotaCard key={`quota-${t.id}`} tenant={t} editable={isAdmin} onSaved={tenant.reload} />
      </div>
      <TenantUsageCard tenantId={t.id} />
      <KeysCard key={`keys-${t.id}`} tenant={t} editable={isAdmin} onChanged={tenant.reload} />
      <TenantHistory key={`history-${t.id}`} tenantId={t.id} />
      <ConfirmDialog
        open={deleting}
        title={`Delete tenant ${t.name}?`}
        message="Its API keys stop working at once and its quota is removed. This cannot be undone."
        confirmLabel="Delete tenant"
        danger
        error={deleteError}
        onConfirm={() => void remove()}
        onClose={() => {
          setDeleting(false);
          setDeleteError(null);
        }}
      />
    </Page>
  );
}

function TenantSettingsCard({ tenant, editable, onSaved }: { tenant: Tenant; editable: boolean; onSaved: () => void }) {
  const [name, setName] = useState(tenant.name);
  const [description, setDescription] = useState(tenant.description ?? "");
  const [isActive, setIsActive] = useState(tenant.is_active ?? true);
  const [logPrompts, setLogPrompts] = useState(tenant.log_prompts ?? false);
  const [shadowConsent, setShadowConsent] = useState(tenant.shadow_consent ?? false);
  const form = useFormState();

  if (!editable) {
    return (
      <Card title="Settings" testId="tenant-settings">
        <dl className="props">
          <dt>Description</dt>
          <dd>{tenant.description || <span className="muted">—</span>}</dd>
          <dt>Active</dt>
          <dd>{tenant.is_active ? "yes" : "no"}</dd>
          <dt>Prompt logging</dt>
          <dd>{tenant.log_prompts ? "on" : "off"}</dd>
          <dt>Shadow mirroring</dt>
          <dd>{tenant.shadow_consent ? "allowed" : "not allowed"}</dd>
          <dt>Created</dt>
          <dd>{formatDateTime(tenant.created_at)}</dd>
          <dt>Updated</dt>
          <dd>{formatDateTime(tenant.updated_at)}</dd>
        </dl>
      </Card>
    );
  }

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void form.run(async () => {
      await api.patch<Tenant>(`/api/tenants/${tenant.id}/`, {
        name,
        description,
        is_active: isActive,
        log_prompts: logPrompts,
        shadow_consent: shadowConsent,
      });
      onSaved();
    });
  };

  return (
    <Card title="Settings" testId="tenant-settings">
      <form onSubmit={submit} noValidate>
        <InputField label="Name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={form.errors} />
        <TextareaField label="Description" name="description" value={description} onChange={(e) => setDescription(e.target.value)} errors={form.errors} />
        <CheckboxField label="Active (inactive tenants' keys are refused)" name="is_active" checked={isActive} onChange={(e) => setIsActive(e.target.checked)} errors={form.errors} />
        <CheckboxField
          label="Keep prompts and outputs in the request log"
          name="log_prompts"
          checked={logPrompts}
          onChange={(e) => setLogPrompts(e.target.checked)}
          errors={form.errors}
        />
        <CheckboxField
          label="Allow shadow mirroring (a share of this tenant's requests may be sent to a candidate version too, and both answers stored for comparison)"
          name="shadow_consent"
          checked={shadowConsent}
          onChange={(e) => setShadowConsent(e.target.checked)}
          errors={form.errors}
        />
        <FormErrors error={form.error} fields={["name", "description", "is_active", "log_prompts", "shadow_consent"]} />
        <div className="form-actions">
          {form.saved && <span className="saved">Saved.</span>}
          <button type="submit" className="btn btn-primary" disabled={form.busy}>
            Save settings
          </button>
        </div>
      </form>
    </Card>
  );
}

function QuotaCard({ tenant, editable, onSaved }: { tenant: Tenant; editable: boolean; onSaved: () => void }) {
  const [draft, setDraft] = useState(() => quotaDraft(tenant.quota));
  const form = useFormState();
  useEffect(() => setDraft(quotaDraft(tenant.quota)), [tenant.quota]);

  if (!editable) {
    return (
      <Card title="Quota" testId="tenant-quota">
        <dl className="props">
          {QUOTA_FIELDS.map(({ name, label }) => (
            <FragmentRow key={name} label={label} value={formatNumber(tenant.quota?.[name])} />
          ))}
        </dl>
      </Card>
    );
  }

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void form.run(async () => {
      await api.patch<Tenant>(`/api/tenants/${tenant.id}/`, { quota: quotaBody(draft) });
      onSaved();
    });
  };

  return (
    <Card title="Quota" testId="tenant-quota">
      <form onSubmit={submit} noValidate>
        <p className="muted" style={{ marginTop: 0 }}>
          Leave a box empty for no limit. Keys may override these.
        </p>
        <QuotaInputs draft={draft} onChange={setDraft} prefix="quota" errors={form.errors} className="grid-2" style={{ gap: "0 16px" }} />
        <FormErrors error={form.error} fields={quotaFieldNames("quota")} />
        <div className="form-actions">
          {form.saved && <span className="saved">Quota saved.</span>}
          <button type="submit" className="btn btn-primary" disabled={form.busy}>
            Save quota
          </button>
        </div>
      </form>
    </Card>
  );
}

function FragmentRow({ label, value }: { label: string; value: string }) {
  return (
    <>
      <dt>{label}</dt>
      <dd>{value}</dd>
    </>
  );
}

function keyStatus(key: ApiKey): string {
  if (key.revoked_at) return "revoked";
  if (!key.is_active) return "expired";
  return "active";
}

function KeysCard({ tenant, editable, onChanged }: { tenant: Tenant; editable: boolean; onChanged: () => void }) {
  const [showRevoked, setShowRevoked] = useState(true);
  const keys = useApi<ApiPage<ApiKey>>("/api/keys/", { tenant: tenant.id, active: showRevoked ? undefined : true, limit: 100 });
  const [creating, setCreating] = useState(false);
  // The only place the raw secret lives; cleared when its dialog closes, so it never renders again.
  const [secret, setSecret] = useState<{ name: string; key: string } | null>(null);
  const [editing, setEditing] = useState<ApiKey | null>(null);
  const [revoking, setRevoking] = useState<ApiKey | null>(null);
  const [revokeError, setRevokeError] = useState<string | null>(null);
  const [revokeBusy, setRevokeBusy] = useState(false);

  const revoke = async () => {
    if (!revoking) return;
    setRevokeBusy(true);
    try {
      await api.post<ApiKey>(`/api/keys/${revoking.id}/revoke/`);
      setRevoking(null);
      setRevokeError(null);
      keys.reload();
      onChanged();
    } catch (err) {
      setRevokeError(errorMessage(err));
    } finally {
      setRevokeBusy(false);
    }
  };

  return (
    <Card
      title="API keys"
      testId="tenant-keys"
      actions={
        <>
          <label className="muted" style={{ display: "flex", gap: 6, alignItems: "center" }}>
            <input type="checkbox" checked={showRevoked} onChange={(e) => setShowRevoked(e.target.checked)} /> Show revoked
          </label>
          {editable && (
            <button type="button" className="btn btn-primary" onClick={() => setCreating(true)}>
              Create key
            </button>
          )}
        </>
      }
    >
      <ErrorState error={keys.error} onRetry={keys.reload} />
      <Table
        testId="keys-table"
        rows={keys.data?.results}
        loading={keys.loading}
        rowKey={(k) => k.id}
        empty="No keys. A tenant needs a key to call /v1/."
        columns={[
          { header: "Name", className: "wrap", cell: (k) => <strong>{k.name}</strong> },
          { header: "Key", cell: (k) => <code>{k.prefix}…</code> },
          { header: "Status", cell: (k) => <StatusBadge status={keyStatus(k)} /> },
          { header: "Scopes", className: "wrap", cell: (k) => (k.scopes?.length ? k.scopes.join(", ") : <span className="muted nowrap">all models</span>) },
          { header: "Created", cell: (k) => formatShortDateTime(k.created_at) },
          { header: "Last used", cell: (k) => formatShortDateTime(k.last_used_at) },
          { header: "Expires", cell: (k) => (k.expires_at ? formatShortDateTime(k.expires_at) : <span className="muted">never</span>) },
          { header: "Quota", cell: (k) => (k.quota_override ? "own" : <span className="muted">tenant's</span>) },
          {
            header: "",
            className: "actions-cell",
            cell: (k) =>
              editable && !k.revoked_at ? (
                <>
                  <button type="button" className="btn btn-small" onClick={() => setEditing(k)}>
                    Edit
                  </button>{" "}
                  <button type="button" className="btn btn-small btn-danger" onClick={() => setRevoking(k)}>
                    Revoke
                  </button>
                </>
              ) : null,
          },
        ]}
      />
      <CreateKeyDialog
        open={creating}
        tenantId={tenant.id}
        onClose={() => setCreating(false)}
        onCreated={(created) => {
          setCreating(false);
          setSecret({ name: created.name, key: created.key });
          keys.reload();
          onChanged();
        }}
      />
      <NewKeySecretDialog secret={secret} onClose={() => setSecret(null)} />
      <EditKeyDialog
        apiKey={editing}
        onClose={() => setEditing(null)}
        onSaved={() => {
          setEditing(null);
          keys.reload();
        }}
      />
      <ConfirmDialog
        open={revoking !== null}
        title={`Revoke key ${revoking?.name ?? ""}?`}
        message={
          <>
            Requests with <code>{revoking?.prefix}…</code> are refused from now on. A revoked key cannot be restored.
          </>
        }
        confirmLabel="Revoke key"
        danger
        busy={revokeBusy}
        error={revokeError}
        onConfirm={() => void revoke()}
        onClose={() => {
          setRevoking(null);
          setRevokeError(null);
        }}
      />
    </Card>
  );
}
