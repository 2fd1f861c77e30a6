import { useState } from "react";
import type { Page as ApiPage, AuditAction, AuditEvent } from "../../api/types";
import { Dialog } from "../../components/Dialog";
import { DebouncedInputField, InputField, SelectField } from "../../components/Field";
import { ErrorState, Page } from "../../components/Page";
import { StatusBadge, type BadgeTone } from "../../components/StatusBadge";
import { Pagination, Table } from "../../components/Table";
import { formatDateTime, isoToLocalInput, localInputToIso } from "../../format";
import { useApi } from "../../hooks/useApi";
import { useQueryParams } from "../../hooks/useQueryParams";

const LIMIT = 25;

const ACTIONS: ReadonlyArray<{ value: AuditAction | ""; label: string }> = [
  { value: "", label: "Any action" },
  { value: "create", label: "Create" },
  { value: "update", label: "Update" },
  { value: "delete", label: "Delete" },
  { value: "revoke", label: "Revoke" },
  { value: "switch", label: "Switch" },
  { value: "action", label: "Action" },
];

const ACTION_TONES: Record<string, BadgeTone> = {
  create: "ok",
  update: "info",
  delete: "bad",
  revoke: "bad",
  switch: "warn",
  action: "off",
};

/** The filters live in the URL, so a filtered view can be shared and survives a reload. */
const FILTERS = ["action", "object_type", "actor_name", "since", "until"] as const;

/** Top-level keys whose values differ between before and after. */
function changedFields(event: AuditEvent): string[] {
  const before = (event.before ?? {}) as Record<string, unknown>;
  const after = (event.after ?? {}) as Record<string, unknown>;
  if (!event.before || !event.after) return [];
  const names = new Set([...Object.keys(before), ...Object.keys(after)]);
  return [...names].filter((name) => JSON.stringify(before[name]) !== JSON.stringify(after[name]));
}

export function AuditPage() {
  const { get, set: setFilter, clear } = useQueryParams();
  const offset = Number(get("offset")) || 0;
  const query: Record<string, string | number> = { limit: LIMIT, offset };
  for (const name of FILTERS) query[name] = get(name);
  const events = useApi<ApiPage<AuditEvent>>("/api/audit/", query);
  const [open, setOpen] = useState<AuditEvent | null>(null);
  // Bumped by "Clear filters" to remount the text filters, which keep their own draft while typing.
  const [generation, setGeneration] = useState(0);

  const anyFilter = FILTERS.some((name) => get(name));

  return (
    <Page title="Audit log" subtitle="Every administrative change: who did what, to which object, with before and after.">
      <div className="filters" data-testid="audit-filters">
        <SelectField label="Action" name="action" options={ACTIONS} value={get("action")} onChange={(e) => setFilter("action", e.target.value)} />
        <DebouncedInputField
          key={`object_type-${generation}`}
          label="Object type"
          name="object_type"
          list="audit-object-types"
          placeholder="e.g. console.tenant"
          value={get("object_type")}
          onCommit={(value) => setFilter("object_type", value)}
        />
        <datalist id="audit-object-types">
          {["console.tenant", "console.apikey", "console.user"].map((type) => (
            <option key={type} value={type} />
          ))}
        </datalist>
        <DebouncedInputField
          key={`actor_name-${generation}`}
          label="Actor"
          name="actor_name"
          placeholder="username"
          value={get("actor_name")}
          onCommit={(value) => setFilter("actor_name", value)}
        />
        <InputField
          label="From"
          name="since"
          type="datetime-local"
          value={isoToLocalInput(get("since"))}
          onChange={(e) => setFilter("since", localInputToIso(e.target.value))}
        />
        <InputField
          label="Until"
          name="until"
          type="datetime-local"
          value={isoToLocalInput(get("until"))}
          onChange={(e) => setFilter("until", localInputToIso(e.target.value))}
        />
        {anyFilter && (
          <button type="button" className="btn" onClick={() => {
              clear();
              setGeneration((n) => n + 1);
            }}>
            Clear filters
          </button>
        )}
      </div>
      <ErrorState error={events.error} onRetry={events.reload} />
      <Table
        testId="audit-table"
        rows={events.data?.results}
        loading={events.loading}
        rowKey={(e) => e.id}
        onRowClick={setOpen}
        empty={anyFilter ? "No events match these filters." : "No events yet."}
        columns={[
          { header: "When", cell: (e) => <span title={e.created_at}>{formatDateTime(e.created_at)}</span> },
          { header: "Actor", cell: (e) => e.actor_name || <span className="muted">system</span> },
          { header: "Action", cell: (e) => <StatusBadge status={e.action} tone={ACTION_TONES[e.action]} /> },
          { header: "Object", cell: (e) => <code>{e.object_type}</code> },
          { header: "Name", wrap: true, cell: (e) => e.object_repr || <span className="muted">#{e.object_id}</span> },
          {
            header: "Changed",
            wrap: true,
            cell: (e) => {
              const fields = changedFields(e);
              return fields.length ? <span className="muted">{fields.join(", ")}</span> : null;
            },
          },
        ]}
        pagination={
          events.data ? (
            <Pagination count={events.data.count} limit={LIMIT} offset={offset} onOffset={(o) => setFilter("offset", o ? String(o) : "")} />
          ) : undefined
        }
      />
      <AuditEventDialog event={open} onClose={() => setOpen(null)} />
    </Page>
  );
}

function AuditEventDialog({ event, onClose }: { event: AuditEvent | null; onClose: () => void }) {
  return (
    <Dialog
      title={event ? `${event.action} ${event.object_type} ${event.object_repr || `#${event.object_id}`}` : ""}
      open={event !== null}
      onClose={onClose}
      testId="audit-event-dialog"
      wide
      footer={
        <button type="button" className="btn" onClick={onClose}>
          Close
        </button>
      }
    >
      {event && (
        <>
          <p className="muted">
            {formatDateTime(event.created_at)} by {event.actor_name || "system"} · object id {event.object_id || "—"}
          </p>
          <div className="grid-2">
            <div>
              <h2>Before</h2>
              <pre className="json">{event.before ? JSON.stringify(event.before, null, 2) : "—"}</pre>
            </div>
            <div>
              <h2>After</h2>
              <pre className="json">{event.after ? JSON.stringify(event.after, null, 2) : "—"}</pre>
            </div>
          </div>
        </>
      )}
    </Dialog>
  );
}
