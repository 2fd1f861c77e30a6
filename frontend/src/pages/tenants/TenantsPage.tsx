import { useState, type FormEvent } from "react";
import { useNavigate } from "react-router-dom";
import { api } from "../../api/client";
import type { Page as ApiPage, Tenant, TenantDefaults } from "../../api/types";
import { useAuth } from "../../auth";
import { Dialog } from "../../components/Dialog";
import { CheckboxField, DebouncedInputField, FormErrors, InputField, TextareaField } from "../../components/Field";
import { ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatDateTime, formatNumber } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";
import { useFormState } from "../../hooks/useFormState";
import { QuotaInputs, quotaBody, quotaDraft, quotaFieldNames, type QuotaDraft } from "./quota";
import "./tenants.css";

const LIMIT = 25;

/** Tenants: a searchable, paged list; admins create new ones here and manage them on the detail page. */
export function TenantsPage() {
  const { isAdmin } = useAuth();
  const navigate = useNavigate();
  const { get, set: setParam } = useQueryParams();
  const offset = Number(get("offset")) || 0;
  const search = get("search");
  const [creating, setCreating] = useState(false);
  const tenants = useApi<ApiPage<Tenant>>("/api/tenants/", { limit: LIMIT, offset, search });

  return (
    <Page
      title="Tenants"
      subtitle="Customers of the proxy: each has API keys and quotas."
      actions={
        isAdmin && (
          <button type="button" className="btn btn-primary" onClick={() => setCreating(true)}>
            New tenant
          </button>
        )
      }
    >
      <div className="filters">
        <DebouncedInputField label="Search" name="search" type="search" placeholder="Name or description" value={search} onCommit={(value) => setParam("search", value)} />
      </div>
      <ErrorState error={tenants.error} onRetry={tenants.reload} />
      <Table
        testId="tenants-table"
        rows={tenants.data?.results}
        loading={tenants.loading}
        rowKey={(t) => t.id}
        onRowClick={(t) => navigate(`/tenants/${t.id}`)}
        empty={search ? "No tenant matches." : "No tenants yet."}
        columns={[
          { header: "Name", wrap: true, cell: (t) => <strong>{t.name}</strong> },
          { header: "Status", cell: (t) => <StatusBadge status={t.is_active ? "active" : "inactive"} /> },
          { header: "Active keys", className: "num", cell: (t) => t.key_count },
          { header: "Requests / min", className: "num", cell: (t) => formatNumber(t.quota?.requests_per_minute) },
          { header: "Tokens / min", className: "num", cell: (t) => formatNumber(t.quota?.tokens_per_minute) },
          { header: "Prompt logging", cell: (t) => (t.log_prompts ? "on" : "off") },
          { header: "Created", cell: (t) => formatDateTime(t.created_at) },
        ]}
        pagination={
          tenants.data && tenants.data.count > LIMIT ? (
            <Pagination count={tenants.data.count} limit={LIMIT} offset={offset} onOffset={(o) => setParam("offset", String(o))} />
          ) : undefined
        }
      />
      <CreateTenantDialog
        open={creating}
        onClose={() => setCreating(false)}
        onCreated={(tenant) => navigate(`/tenants/${tenant.id}`)}
      />
    </Page>
  );
}

function CreateTenantDialog({ open, onClose, onCreated }: { open: boolean; onClose: () => void; onCreated: (t: Tenant) => void }) {
  // Only while open, so that the list page does not ask for defaults nobody looks at.
  const defaults = useApi<TenantDefaults>(open ? "/api/tenants/defaults/" : null);
  return (
    <Dialog title="New tenant" open={open} onClose={onClose} testId="create-tenant-dialog" wide>
      {/* Mounted once the defaults are in, so the limit boxes start prefilled with them. */}
      <ErrorState error={defaults.error} onRetry={defaults.reload} />
      {open && defaults.data ? (
        <CreateTenantForm defaultQuota={quotaDraft(defaults.data.quota)} onClose={onClose} onCreated={onCreated} />
      ) : (
        !defaults.error && <p className="muted">Loading…</p>
      )}
    </Dialog>
  );
}

function CreateTenantForm({ defaultQuota, onClose, onCreated }: { defaultQuota: QuotaDraft; onClose: () => void; onCreated: (t: Tenant) => void }) {
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [logPrompts, setLogPrompts] = useState(false);
  const [quota, setQuota] = useState(defaultQuota);
  const { error, busy, run, errors } = useFormState();

  const submit = (event: FormEvent) => {
    event.preventDefault();
    void run(async () => {
      // Every limit is sent as shown: what the admin saw in the boxes is what the tenant gets.
      const tenant = await api.post<Tenant>("/api/tenants/", { name, description, log_prompts: logPrompts, quota: quotaBody(quota) });
      onClose();
      onCreated(tenant);
    });
  };

  return (
    <form onSubmit={submit} noValidate>
      <InputField label="Name" name="name" value={name} onChange={(e) => setName(e.target.value)} errors={errors} autoFocus required />
      <TextareaField label="Description" name="description" value={description} onChange={(e) => setDescription(e.target.value)} errors={errors} />
      <CheckboxField
        label="Keep prompts and outputs in the request log"
        name="log_prompts"
        checked={logPrompts}
        onChange={(e) => setLogPrompts(e.target.checked)}
        errors={errors}
      />
      <fieldset className="quota-fieldset" data-testid="create-tenant-quota">
        <legend>Limits</legend>
        <p className="muted">The defaults for a new tenant; change any, or empty a box for no limit. Keys may override them later.</p>
        <QuotaInputs draft={quota} onChange={setQuota} prefix="quota" errors={errors} />
      </fieldset>
      <FormErrors error={error} fields={["name", "description", "log_prompts", "quota", ...quotaFieldNames("quota")]} />
      <div className="form-actions">
        <button type="button" className="btn" onClick={onClose} disabled={busy}>
          Cancel
        </button>
        <button type="submit" className="btn btn-primary" disabled={busy}>
          Create tenant
        </button>
      </div>
    </form>
  );
}
