import { diffJson } from "diff";
import { useEffect, useMemo, useRef, useState } from "react";
import { Link, useNavigate, useParams } from "react-router-dom";
import { ApiError, api, type FieldErrors } from "../../api/client";
import type { ModelAlias, Page as ApiPage, RoutePool, StageChain, StageChainRequest, StageChainVersion, StageKind, Tenant } from "../../api/types";
import { useAuth } from "../../auth";
import { ConfirmDialog } from "../../components/Dialog";
import { CheckboxField, FormErrors, InputField, SelectField, TextareaField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { StatusBadge } from "../../components/StatusBadge";
import { Table } from "../../components/Table";
import { formatDateTime } from "../../format";
import { useApi } from "../../hooks/useApi";
import { ChainDiagram } from "./ChainDiagram";
import "./routing.css";
import {
  STAGE_KINDS,
  draftStage,
  fieldOfError,
  kindInfo,
  newStage,
  stageForApi,
  stageName,
  stageOfError,
  type ClassifyRule,
  type DraftStage,
} from "./stageKinds";

interface ChainForm {
  name: string;
  alias: string;
  /** Tenant name; "" applies to every tenant. */
  tenant: string;
  enabled: boolean;
}

type Option = { value: string; label: string };

/** What the pool selects offer: route pools, and aliases (an alias's own ready deployments are a pool too). */
interface Choices {
  pools: Option[];
  chains: Option[];
}

/** Create or edit one stage chain, see it drawn as it changes, and read its version history. */
export function StageChainPage() {
  const { id } = useParams();
  const isNew = id === "new";
  const navigate = useNavigate();
  const { isAdmin } = useAuth();
  const chain = useApi<StageChain>(isNew ? null : `/api/stage-chains/${id}/`);
  const versions = useApi<StageChainVersion[]>(isNew ? null : `/api/stage-chains/${id}/versions/`);
  const routePools = useApi<ApiPage<RoutePool>>("/api/route-pools/", { limit: 200 });
  const aliases = useApi<ApiPage<ModelAlias>>("/api/model-aliases/", { limit: 200 });
  const tenants = useApi<ApiPage<Tenant>>("/api/tenants/", { limit: 200 });
  const allChains = useApi<ApiPage<StageChain>>("/api/stage-chains/", { limit: 200 });

  const [form, setForm] = useState<ChainForm>({ name: "", alias: "", tenant: "", enabled: true });
  const [stages, setStages] = useState<DraftStage[]>(() => (isNew ? [newStage("generate")] : []));
  const [error, setError] = useState<ApiError | Error | null>(null);
  const [saving, setSaving] = useState(false);
  const [saved, setSaved] = useState<string | null>(null);
  const [confirmDelete, setConfirmDelete] = useState(false);
  const [addKind, setAddKind] = useState<StageKind>("guard");
  const loadedFor = useRef<string | null>(null);

  // Fill the form once per chain; later reloads (after a save) must not overwrite edits in progress.
  useEffect(() => {
    if (!chain.data || loadedFor.current === id) return;
    loadedFor.current = id ?? null;
    setForm({ name: chain.data.name, alias: chain.data.alias, tenant: chain.data.tenant ?? "", enabled: chain.data.enabled });
    setStages(chain.data.stages.map(draftStage));
  }, [chain.data, id]);

  const choices: Choices = useMemo(() => {
    const pools: Option[] = (routePools.data?.results ?? []).map((p) => ({ value: p.name, label: `${p.name} (pool of ${p.alias}${p.role ? `, ${p.role}` : ""})` }));
    const named = new Set(pools.map((p) => p.value));
    for (const alias of aliases.data?.results ?? []) {
      if (!named.has(alias.name)) pools.push({ value: alias.name, label: `${alias.name} (all its deployments)` });
    }
    const chains = (allChains.data?.results ?? []).filter((c) => String(c.id) !== id).map((c) => ({ value: c.name, label: c.name }));
    return { pools, chains };
  }, [routePools.data, aliases.data, allChains.data, id]);

  // Server messages about the stages: the ones that name a stage go on its card, the rest above the list.
  const stageMessages = error instanceof ApiError ? (error.fieldErrors["stages"] ?? []) : [];
  const byStage = new Map<number, string[]>();
  const chainWide: string[] = [];
  for (const message of stageMessages) {
    const index = stageOfError(message, stages);
    if (index === null) chainWide.push(message);
    else byStage.set(index, [...(byStage.get(index) ?? []), message]);
  }
  const fieldErrors = error instanceof ApiError ? error.fieldErrors : undefined;
  const apiStages = stages.map(stageForApi);

  function update(index: number, change: Partial<DraftStage>) {
    setStages((list) => list.map((stage, i) => (i === index ? { ...stage, ...change } : stage)));
  }
  function move(index: number, by: number) {
    setError(null); // the server's messages name stages by their place, which this changes
    setStages((list) => {
      const to = index + by;
      if (to < 0 || to >= list.length) return list;
      const copy = [...list];
      const [moved] = copy.splice(index, 1);
      if (moved) copy.splice(to, 0, moved);
      return copy;
    });
  }
  function add() {
    setError(null);
    const stage = newStage(addKind);
    setStages((list) => {
      // Classify picks the pool and a cache answers instead of generating: both go before the generate
      // step; everything else goes last.
      const at = kindInfo(addKind)?.before ? list.findIndex((s) => s.kind === "generate") : -1;
      return at >= 0 ? [...list.slice(0, at), stage, ...list.slice(at)] : [...list, stage];
    });
  }

  async function save() {
    setSaved(null);
    const broken = stages.findIndex((s) => s.jsonError);
    const stage = stages[broken];
    if (stage) {
      setError(new Error(`Stage ${broken + 1} (${stageName(stage, broken)}): its JSON does not parse; fix it before saving.`));
      return;
    }
    setSaving(true);
    const body: StageChainRequest = { name: form.name, alias: form.alias, tenant: form.tenant || null, enabled: form.enabled, stages: apiStages };
    try {
      const result = isNew ? await api.post<StageChain>("/api/stage-chains/", body) : await api.patch<StageChain>(`/api/stage-chains/${id}/`, body);
      setError(null);
      if (isNew) {
        navigate(`/routing/chains/${result.id}`);
        return;
      }
      setSaved(`Saved as version ${result.version}.`);
      chain.reload();
      versions.reload();
    } catch (err) {
      if (err instanceof ApiError) setError(err);
      else throw err;
    } finally {
      setSaving(false);
    }
  }

  async function toggle() {
    if (!chain.data) return;
    setSaved(null);
    try {
      const result = await api.patch<StageChain>(`/api/stage-chains/${id}/`, { enabled: !chain.data.enabled });
      setForm((f) => ({ ...f, enabled: result.enabled }));
      setSaved(`${result.enabled ? "Enabled" : "Disabled"}: version ${result.version}.`);
      chain.reload();
      versions.reload();
    } catch (err) {
      setError(err instanceof Error ? err : new Error(String(err)));
    }
  }

  const [deleteError, setDeleteError] = useState<string | null>(null);
  async function remove() {
    try {
      await api.delete(`/api/stage-chains/${id}/`);
      navigate("/routing/chains");
    } catch (err) {
      setDeleteError(err instanceof Error ? err.message : String(err));
    }
  }

  const title = isNew ? "New stage chain" : chain.data ? `Chain ${chain.data.name}` : "Stage chain";
  return (
    <Page
      title={title}
      subtitle={
        <>
          {chain.data && (
            <>
              <StatusBadge status={chain.data.enabled ? "enabled" : "disabled"} tone={chain.data.enabled ? "ok" : "off"} /> v{chain.data.version} ·{" "}
            </>
          )}
          <Link to="/routing/chains">All chains</Link>
        </>
      }
      actions={
        isAdmin && chain.data ? (
          <>
            <button type="button" className="btn" data-testid="chain-toggle" onClick={() => void toggle()}>
              {chain.data.enabled ? "Disable" : "Enable"}
            </button>{" "}
            <button type="button" className="btn btn-danger" onClick={() => setConfirmDelete(true)}>
              Delete
            </button>
          </>
        ) : undefined
      }
    >
      <ErrorState error={chain.error} onRetry={chain.reload} />
      <Card title="Diagram" testId="diagram-card">
        <ChainDiagram stages={apiStages} />
      </Card>
      <Card title="Chain" testId="chain-form">
        <div className="grid-2">
          <InputField label="Name" name="name" value={form.name} onChange={(e) => setForm({ ...form, name: e.target.value })} errors={fieldErrors} />
          <InputField
            label="Model alias"
            name="alias"
            value={form.alias}
            onChange={(e) => setForm({ ...form, alias: e.target.value })}
            errors={fieldErrors}
            hint="Requests for this alias pass the chain; empty: every alias (with a tenant), or none (a chain other chains include)."
          />
          <SelectField
            label="Tenant"
            name="tenant"
            options={[{ value: "", label: "Every tenant" }, ...(tenants.data?.results ?? []).map((t) => ({ value: t.name, label: t.name }))]}
            value={form.tenant}
            onChange={(e) => setForm({ ...form, tenant: e.target.value })}
            errors={fieldErrors}
          />
          <CheckboxField label="Enabled" name="enabled" checked={form.enabled} onChange={(e) => setForm({ ...form, enabled: e.target.checked })} errors={fieldErrors} hint="A disabled chain is kept but applies to no request." />
        </div>
      </Card>
      <Card
        title="Stages"
        testId="stages-card"
        actions={
          isAdmin ? (
            <span className="chain-add">
              <select aria-label="Stage kind" value={addKind} onChange={(e) => setAddKind(e.target.value as StageKind)} data-testid="add-stage-kind">
                {STAGE_KINDS.map((k) => (
                  <option key={k.kind} value={k.kind}>
                    {k.label}
                  </option>
                ))}
              </select>
              <button type="button" className="btn" onClick={add} data-testid="add-stage">
                Add stage
              </button>
            </span>
          ) : undefined
        }
      >
        <p className="muted">Pre-stages run before the generate step, post-stages on the answer after it. Exactly one generate step.</p>
        {chainWide.length > 0 && (
          <div className="form-error" role="alert" data-testid="stages-error">
            {chainWide.map((m) => (
              <div key={m}>{m}</div>
            ))}
          </div>
        )}
        {stages.map((stage, index) => (
          <StageCard
            key={stage.key}
            stage={stage}
            index={index}
            count={stages.length}
            canEdit={isAdmin}
            choices={choices}
            errors={byStage.get(index) ?? (stage.jsonError ? [stage.jsonError] : [])}
            onChange={(change) => update(index, change)}
            onMove={(by) => move(index, by)}
            onRemove={() => {
              setError(null);
              setStages((list) => list.filter((_, i) => i !== index));
            }}
          />
        ))}
        <FormErrors error={error} fields={["name", "alias", "tenant", "enabled", "stages"]} />
        {saved && (
          <p className="chain-saved" role="status" data-testid="chain-saved">
            {saved}
          </p>
        )}
        {isAdmin && (
          <div className="chain-save">
            <button type="button" className="btn btn-primary" disabled={saving} onClick={() => void save()} data-testid="chain-save">
              {isNew ? "Create chain" : "Save as new version"}
            </button>
          </div>
        )}
      </Card>
      {!isNew && <VersionsCard versions={versions.data} error={versions.error} onRetry={versions.reload} />}
      <ConfirmDialog
        title="Delete chain"
        open={confirmDelete}
        message={`Delete the chain '${chain.data?.name ?? ""}' and its version history? Requests it applied to go straight to their pool.`}
        confirmLabel="Delete"
        danger
        error={deleteError}
        onConfirm={() => void remove()}
        onClose={() => setConfirmDelete(false)}
      />
    </Page>
  );
}

interface StageCardProps {
  stage: DraftStage;
  index: number;
  count: number;
  /** Viewers see the chain but no buttons that change it (the API refuses their writes anyway). */
  canEdit: boolean;
  choices: Choices;
  errors: string[];
  onChange: (change: Partial<DraftStage>) => void;
  onMove: (by: number) => void;
  onRemove: () => void;
}

function StageCard({ stage, index, count, canEdit, choices, errors, onChange, onMove, onRemove }: StageCardProps) {
  const info = kindInfo(stage.kind);
  const setConfig = (config: Record<string, unknown>) => onChange({ config });
  // A message about one field goes under that field (named `stage-<index>-<field>` in the forms); the rest, and
  // every message while the stage is edited as JSON, at the top of the card.
  const fields: FieldErrors = {};
  const onCard: string[] = [];
  for (const message of errors) {
    const field = stage.json === undefined ? fieldOfError(message) : null;
    // On its stage's card the "stages[2].config." prefix says nothing more: "terms[0] is not a valid ...".
    const text = message.replace(/^stages\[\d+\]\.(config\.)?/, "");
    if (field) (fields[`stage-${index}-${field}`] ??= []).push(text);
    else onCard.push(text);
  }
  return (
    <section className={errors.length ? "stage-card stage-card-invalid" : "stage-card"} data-testid={`stage-${index}`} data-kind={stage.kind}>
      <header className="stage-card-head">
        <strong>
          {index + 1}. {info?.label ?? stage.kind}
        </strong>
        <span className="muted stage-card-hint">{info?.hint ?? "Edited as JSON: the console has no form for this kind."}</span>
        <span className="stage-card-buttons">
          {canEdit && (
            <>
              <button type="button" className="btn btn-small" aria-label="Move up" disabled={index === 0} onClick={() => onMove(-1)}>
                ↑
              </button>
              <button type="button" className="btn btn-small" aria-label="Move down" disabled={index === count - 1} onClick={() => onMove(1)}>
                ↓
              </button>
            </>
          )}
          {info?.form && (
            // Any stage may be edited as JSON, e.g. for a setting the form does not show; back to the form once it parses.
            <button
              type="button"
              className="btn btn-small"
              disabled={stage.json !== undefined && stage.jsonError !== undefined}
              onClick={() =>
                onChange(stage.json === undefined ? { json: JSON.stringify(stageForApi(stage).config ?? {}, null, 2) } : { json: undefined, jsonError: undefined })
              }
            >
              {stage.json === undefined ? "Edit as JSON" : "Back to form"}
            </button>
          )}
          {canEdit && (
            <button type="button" className="btn btn-small btn-danger" aria-label="Remove stage" onClick={onRemove}>
              Remove
            </button>
          )}
        </span>
      </header>
      {onCard.length > 0 && (
        <div className="field-error" role="alert" data-testid={`stage-error-${index}`}>
          {onCard.join(" ")}
        </div>
      )}
      <div className="grid-2">
        <InputField label="Stage name" name={`stage-${index}-name`} value={stage.name} placeholder={`${stage.kind}${index}`} onChange={(e) => onChange({ name: e.target.value })} errors={fields} />
      </div>
      {stage.json === undefined && info?.form === "generate" && <GenerateForm config={stage.config} choices={choices} onChange={setConfig} index={index} errors={fields} />}
      {stage.json === undefined && info?.form === "guard" && <GuardForm config={stage.config} onChange={setConfig} index={index} errors={fields} />}
      {stage.json === undefined && info?.form === "classify" && <ClassifyForm config={stage.config} choices={choices} onChange={setConfig} index={index} errors={fields} />}
      {stage.json === undefined && info?.form === "chain" && (
        <SelectField
          label="Chain to include"
          name={`stage-${index}-chain`}
          options={withCurrent([{ value: "", label: "Choose a chain" }, ...choices.chains], stage.config.chain)}
          value={String(stage.config.chain ?? "")}
          onChange={(e) => setConfig({ ...stage.config, chain: e.target.value })}
          errors={fields}
        />
      )}
      {stage.json !== undefined && (
        <TextareaField
          label="Config (JSON)"
          name={`stage-${index}-json`}
          rows={6}
          className="chain-json"
          value={stage.json}
          onChange={(e) => {
            const text = e.target.value;
            try {
              const parsed: unknown = JSON.parse(text || "{}");
              if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("the config must be a JSON object");
              onChange({ json: text, config: parsed as Record<string, unknown>, jsonError: undefined });
            } catch (err) {
              onChange({ json: text, jsonError: `Config JSON: ${err instanceof Error ? err.message : String(err)}` });
            }
          }}
        />
      )}
    </section>
  );
}

/** The options, plus the current value if it is not among them (a pool deleted since, say), so it shows. */
function withCurrent(options: Option[], current: unknown): Option[] {
  const value = current == null ? "" : String(current);
  return value && !options.some((o) => o.value === value) ? [...options, { value, label: `${value} (not found)` }] : options;
}

type Config = Record<string, unknown>;

interface FormProps {
  config: Config;
  onChange: (c: Config) => void;
  index: number;
  errors: FieldErrors;
}

function GenerateForm({ config, choices, onChange, index, errors }: FormProps & { choices: Choices }) {
  return (
    <SelectField
      label="Pool"
      name={`stage-${index}-pool`}
      options={withCurrent([{ value: "", label: "The alias's policy picks" }, ...choices.pools], config.pool)}
      value={String(config.pool ?? "")}
      onChange={(e) => onChange({ ...config, pool: e.target.value })}
      errors={errors}
    />
  );
}

function GuardForm({ config, onChange, index, errors }: FormProps) {
  const terms = Array.isArray(config.terms) ? (config.terms as string[]) : [];
  return (
    <div className="grid-2">
      <TextareaField
        label="Terms (one a line)"
        name={`stage-${index}-terms`}
        rows={3}
        value={terms.join("\n")}
        onChange={(e) => onChange({ ...config, terms: e.target.value.split("\n") })}
        hint="Matched case-insensitively."
        errors={errors}
      />
      <div>
        <SelectField
          label="Action"
          name={`stage-${index}-action`}
          options={[
            { value: "block", label: "Block (content_filter error)" },
            { value: "mask", label: "Mask with *" },
          ]}
          value={String(config.action ?? "block")}
          onChange={(e) => onChange({ ...config, action: e.target.value })}
          errors={errors}
        />
        <CheckboxField label="Terms are regular expressions" name={`stage-${index}-regex`} checked={config.regex === true} onChange={(e) => onChange({ ...config, regex: e.target.checked })} errors={errors} />
      </div>
    </div>
  );
}

const TRI: Option[] = [
  { value: "", label: "Either" },
  { value: "true", label: "Yes" },
  { value: "false", label: "No" },
];

function ClassifyForm({ config, choices, onChange, index, errors }: FormProps & { choices: Choices }) {
  const rules = Array.isArray(config.rules) ? (config.rules as ClassifyRule[]) : [];
  const setRule = (r: number, rule: ClassifyRule) => onChange({ ...config, rules: rules.map((old, i) => (i === r ? rule : old)) });
  return (
    <div className="classify-rules">
      {rules.map((rule, r) => {
        const match = rule.match ?? {};
        const setMatch = (name: string, value: unknown) => setRule(r, { ...rule, match: { ...match, [name]: value } });
        const number = (name: string) => ({
          value: match[name] == null ? "" : String(match[name]),
          onChange: (e: { target: { value: string } }) => setMatch(name, e.target.value === "" ? undefined : Number(e.target.value)),
        });
        const tri = (name: string) => ({
          value: typeof match[name] === "boolean" ? String(match[name]) : "",
          onChange: (e: { target: { value: string } }) => setMatch(name, e.target.value === "" ? undefined : e.target.value === "true"),
        });
        const keywords = Array.isArray(match.keywords) ? (match.keywords as string[]) : [];
        const at = `stage-${index}-rules.${r}`;
        return (
          <fieldset key={r} className="classify-rule" data-testid={`rule-${index}-${r}`}>
            <legend>
              Rule {r + 1}{" "}
              <button type="button" className="btn btn-small" disabled={rules.length === 1} onClick={() => onChange({ ...config, rules: rules.filter((_, i) => i !== r) })}>
                Remove rule
              </button>
            </legend>
            {(errors[`${at}`] ?? []).length > 0 && (
              <div className="field-error" role="alert" data-testid={`rule-error-${index}-${r}`}>
                {(errors[`${at}`] ?? []).join(" ")}
              </div>
            )}
            <div className="grid-3">
              <InputField label="Keywords (comma-separated)" name={`${at}-keywords`} value={keywords.join(",")} onChange={(e) => setMatch("keywords", e.target.value.split(","))} />
              <CheckboxField label="Keywords are regular expressions" name={`${at}-regex`} checked={match.regex === true} onChange={(e) => setMatch("regex", e.target.checked || undefined)} />
              <SelectField label="Send to pool" name={`${at}-pool`} options={withCurrent([{ value: "", label: "Choose a pool" }, ...choices.pools], rule.pool)} value={rule.pool ?? ""} onChange={(e) => setRule(r, { ...rule, pool: e.target.value })} />
              <InputField label="Prompt tokens at least" name={`${at}-min_prompt_tokens`} type="number" min={0} {...number("min_prompt_tokens")} />
              <InputField label="Prompt tokens at most" name={`${at}-max_prompt_tokens`} type="number" min={0} {...number("max_prompt_tokens")} />
              <SelectField label="Has code" name={`${at}-code`} options={TRI} {...tri("code")} />
              <InputField label="Messages at least" name={`${at}-min_messages`} type="number" min={0} {...number("min_messages")} />
              <InputField label="Messages at most" name={`${at}-max_messages`} type="number" min={0} {...number("max_messages")} />
              <SelectField label="Has images" name={`${at}-images`} options={TRI} {...tri("images")} />
            </div>
          </fieldset>
        );
      })}
      <button type="button" className="btn btn-small" onClick={() => onChange({ ...config, rules: [...rules, { match: {}, pool: "" }] })}>
        Add rule
      </button>
    </div>
  );
}

/** What the diff compares: what a version applies to and its stages (diffJson: one key a line, keys sorted,
 * and a comma that appears because a line was added after it is no change). */
function versionBody(v: StageChainVersion): object {
  return { alias: v.alias, tenant: v.tenant, enabled: v.enabled, stages: v.stages };
}

function VersionsCard({ versions, error, onRetry }: { versions: StageChainVersion[] | undefined; error: unknown; onRetry: () => void }) {
  const [pair, setPair] = useState<{ from: number; to: number } | null>(null);
  const list = versions ?? [];
  const newest = list[0]?.version;
  // Default: the newest version against the one before it.
  const to = pair?.to ?? newest;
  const from = pair?.from ?? list[1]?.version ?? newest;
  const a = list.find((v) => v.version === from);
  const b = list.find((v) => v.version === to);
  const options = list.map((v) => ({ value: String(v.version), label: `v${v.version}` }));
  return (
    <Card title="Versions" testId="versions-card">
      <ErrorState error={error} onRetry={onRetry} />
      <Table
        testId="versions-table"
        rows={versions}
        loading={versions === undefined && !error}
        rowKey={(v) => v.version}
        columns={[
          { header: "Version", cell: (v) => `v${v.version}` },
          { header: "Saved by", cell: (v) => v.created_by ?? <span className="muted">unknown</span> },
          { header: "When", cell: (v) => formatDateTime(v.created_at) },
          { header: "Applies to", cell: (v) => `${v.alias || "any alias"} · ${v.tenant ?? "any tenant"}` },
          { header: "State", cell: (v) => (v.enabled ? "enabled" : "disabled") },
          { header: "Stages", cell: (v) => <ChainDiagram stages={v.stages} compact testId={`version-compact-${v.version}`} /> },
        ]}
      />
      {a && b && (
        <div className="version-diff" data-testid="version-diff">
          <div className="version-diff-pick">
            <SelectField label="From" name="diff-from" options={options} value={String(from)} onChange={(e) => setPair({ from: Number(e.target.value), to: to ?? 0 })} />
            <SelectField label="To" name="diff-to" options={options} value={String(to)} onChange={(e) => setPair({ from: from ?? 0, to: Number(e.target.value) })} />
          </div>
          <pre className="diff-lines">
            {diffJson(versionBody(a), versionBody(b)).map((part, i) => (
              <span key={i} className={part.added ? "diff-add" : part.removed ? "diff-del" : "diff-same"}>
                {part.value
                  .replace(/\n$/, "")
                  .split("\n")
                  .map((line) => `${part.added ? "+ " : part.removed ? "- " : "  "}${line}`)
                  .join("\n")}
                {"\n"}
              </span>
            ))}
          </pre>
        </div>
      )}
    </Card>
  );
}
