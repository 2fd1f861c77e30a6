// The playground: a chat sent to an alias (or one of its versions) from the console, through the real
// /v1/ path with a tenant's key, the answer streamed, the route decision and the timings beside it; in
// compare mode the same prompt goes to two targets at once, side by side. docs/tenants.md "Playground".
import { useRef, useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { api, errorMessage, type FieldErrors } from "../../api/client";
import type { AliasServing, ApiKeyCreated, Page as ApiPage, RequestLogPage, RequestLogRow, Tenant } from "../../api/types";
import { CheckboxField, InputField, SelectField, TextareaField } from "../../components/Field";
import { Card, ErrorState, Page } from "../../components/Page";
import { useAuth } from "../../auth";
import { useApi } from "../../hooks/useApi";
import { routeSteps } from "../requests/routeReason";
import { emptyProgress, streamChat, tokensPerSecond, VERSION_HEADER, type ChatMessage, type ChatProgress } from "./stream";
import "./playground.css";

/** How long a key made here lives: long enough for a session at the playground, short if forgotten. */
const PLAYGROUND_KEY_HOURS = 1;
const LOG_WAIT_MS = 10_000;

interface Target {
  alias: string;
  /** A version id as a string, or "" for "routing decides". */
  version: string;
}

interface Run {
  target: Target;
  /** The turns before this one, shown above the answer. */
  history: ChatMessage[];
  /** The message this run sent. */
  user: string;
  label: string;
  progress: ChatProgress;
  log: RequestLogRow | null;
  logMissing: boolean;
}

interface HeldKey {
  value: string;
  /** Set when this page made the key: what to show instead of the key itself. */
  made?: { prefix: string; tenant: string; expires: string };
}

/** Which form field an OpenAI error's `param` belongs to. */
function fieldOf(param: string | null, side: "a" | "b"): string {
  if (param === "max_tokens" || param === "max_completion_tokens") return "max_tokens";
  if (param === "temperature") return "temperature";
  if (param === "messages") return "user";
  if (param === "model" || param === VERSION_HEADER) return `target_${side}`;
  return "";
}

function targetLabel(target: Target, serving: AliasServing[] | undefined): string {
  if (!target.version) return `${target.alias} (routing decides)`;
  const version = serving?.find((s) => s.alias_name === target.alias)?.versions.find((v) => String(v.version_id) === target.version);
  return `${target.alias} @ ${version?.version_label ?? `version ${target.version}`}`;
}

async function findLogRow(requestId: string): Promise<RequestLogRow | null> {
  // The proxy writes its log in batches off the hot path (about every half second).
  const deadline = Date.now() + LOG_WAIT_MS;
  while (Date.now() < deadline) {
    const page = await api.get<RequestLogPage>("/api/request-log/", { request_id: requestId });
    const [row] = page.results;
    if (row) return row;
    await new Promise((resolve) => setTimeout(resolve, 300));
  }
  return null;
}

function ms(value: number | null | undefined): string {
  if (value === null || value === undefined) return "–";
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${Math.round(value)} ms`;
}

function TargetPicker({ side, target, serving, errors, onChange }: { side: "a" | "b"; target: Target; serving: AliasServing[]; errors: FieldErrors; onChange: (t: Target) => void }) {
  const alias = serving.find((s) => s.alias_name === target.alias);
  const versions = (alias?.versions ?? []).filter((v) => v.engines_ready > 0);
  return (
    <div className="playground-target" data-testid={`target-${side}`}>
      <SelectField
        label={side === "a" ? "Model" : "Model (B)"}
        name={`target_${side}`}
        errors={errors}
        value={target.alias}
        onChange={(e) => onChange({ alias: e.target.value, version: "" })}
        options={serving.map((s) => ({ value: s.alias_name, label: s.alias_name }))}
      />
      <SelectField
        label={side === "a" ? "Version" : "Version (B)"}
        name={`version_${side}`}
        value={target.version}
        onChange={(e) => onChange({ ...target, version: e.target.value })}
        hint={target.version ? `Sent with ${VERSION_HEADER}: ${target.version}` : "As any client's request: the alias's routing picks."}
        options={[
          { value: "", label: "Routing decides" },
          ...versions.map((v) => ({ value: String(v.version_id), label: `${v.version_label} (${v.role}, ${v.engines_ready} ready)` })),
        ]}
      />
    </div>
  );
}

function KeyCard({ held, onKey }: { held: HeldKey | null; onKey: (k: HeldKey | null) => void }) {
  const { isAdmin } = useAuth();
  const tenants = useApi<ApiPage<Tenant>>(isAdmin ? "/api/tenants/" : null, { limit: 200 });
  const [tenant, setTenant] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [fieldErrors, setFieldErrors] = useState<FieldErrors>({});

  const makeKey = async () => {
    setBusy(true);
    setError(null);
    setFieldErrors({});
    try {
      const expires = new Date(Date.now() + PLAYGROUND_KEY_HOURS * 3600_000).toISOString();
      const made = await api.post<ApiKeyCreated>("/api/keys/", { tenant: Number(tenant) || null, name: "playground", expires_at: expires });
      onKey({ value: made.key, made: { prefix: made.prefix, tenant: made.tenant_name, expires } });
    } catch (err) {
      setError(err);
      if (err && typeof err === "object" && "fieldErrors" in err) setFieldErrors((err as { fieldErrors: FieldErrors }).fieldErrors);
    } finally {
      setBusy(false);
    }
  };

  return (
    <Card title="Key" testId="playground-key">
      {held?.made ? (
        <p data-testid="playground-key-made">
          Using the new key <code>{held.made.prefix}…</code> “playground” of tenant <strong>{held.made.tenant}</strong>, until{" "}
          {new Date(held.made.expires).toLocaleTimeString()}. Its requests count against that tenant's limits and show in the request log under
          this key.{" "}
          <button type="button" className="btn btn-small" onClick={() => onKey(null)}>
            Forget it
          </button>
        </p>
      ) : (
        <div>
          <InputField
            label="Tenant API key"
            name="key"
            type="password"
            autoComplete="off"
            value={held?.value ?? ""}
            onChange={(e) => onKey(e.target.value ? { value: e.target.value } : null)}
            hint="Kept in this page only: never stored, sent only to /v1/ as the bearer key. Reloading forgets it."
          />
          {isAdmin && (
            <div>
              <SelectField
                label="Or make a playground key for tenant"
                name="tenant"
                errors={fieldErrors}
                value={tenant}
                onChange={(e) => setTenant(e.target.value)}
                hint={`A key named “playground” that expires in ${PLAYGROUND_KEY_HOURS} hour; made like any key (audited), shown to nobody.`}
                options={[{ value: "", label: "Choose a tenant" }, ...(tenants.data?.results ?? []).map((t) => ({ value: String(t.id), label: t.name }))]}
              />
              <button type="button" className="btn" onClick={makeKey} disabled={busy || !tenant}>
                Make playground key
              </button>
              {error !== null && Object.keys(fieldErrors).length === 0 && <ErrorState error={error} />}
            </div>
          )}
        </div>
      )}
    </Card>
  );
}

function RunPane({ run, side }: { run: Run; side: "a" | "b" }) {
  const { progress: p, log } = run;
  const completion = p.completionTokens ?? log?.completion_tokens ?? null;
  const rate = tokensPerSecond({ ttftMs: p.ttftMs, totalMs: p.totalMs, completionTokens: completion });
  const status = p.error?.code === "stopped" ? "Stopped" : p.error ? `Failed (${p.error.status || "no answer"})` : p.done ? `Done${p.finishReason ? ` (${p.finishReason})` : ""}` : "Streaming…";
  return (
    <div className="card playground-run" data-testid={`run-${side}`}>
      <div className="card-header">
        <h2 data-testid="run-target">{run.label}</h2>
        <span className="muted" data-testid="run-status">
          {status}
        </span>
      </div>
      <div className="card-body">
        {p.error && (
          <div className="notice notice-bad" role="alert" data-testid="run-error">
            {p.error.message}
            {p.error.param && <span className="muted"> (field: {p.error.param})</span>}
          </div>
        )}
        {run.history.length > 0 && (
          <ol className="playground-turns" data-testid="turns">
            {run.history.map((turn, n) => (
              <li key={n} className={`playground-turn playground-turn-${turn.role}`} data-testid="turn">
                <span className="muted">{turn.role === "user" ? "You" : "Model"}:</span> {turn.content}
              </li>
            ))}
            <li className="playground-turn playground-turn-user">
              <span className="muted">You:</span> {run.user}
            </li>
          </ol>
        )}
        <div className="playground-answer" data-testid="answer" aria-live="polite">
          {p.text || (p.done ? "" : "…")}
        </div>
        <dl className="playground-facts" data-testid="timing">
          <dt>Time to first token</dt>
          <dd data-testid="timing-ttft">{ms(p.ttftMs)}</dd>
          <dt>Total</dt>
          <dd data-testid="timing-total">{ms(p.totalMs)}</dd>
          <dt>Output tokens/s</dt>
          <dd data-testid="timing-rate">{rate === null ? "–" : rate.toFixed(1)}</dd>
          <dt>Tokens in / out</dt>
          <dd data-testid="timing-tokens">
            {p.promptTokens ?? log?.prompt_tokens ?? "–"} / {completion ?? "–"}
          </dd>
          {log && (
            <>
              <dt>At the proxy</dt>
              <dd data-testid="timing-proxy">
                TTFT {ms(log.ttft_ms)}, total {ms(log.latency_ms)}
              </dd>
            </>
          )}
        </dl>
        <h3 className="playground-subhead">Route decision</h3>
        {!p.requestId && <p className="muted">No request id: the proxy did not answer.</p>}
        {p.requestId && !log && !run.logMissing && <p className="muted">Reading the request log…</p>}
        {p.requestId && run.logMissing && <p className="muted">Not in the request log yet.</p>}
        {log && (
          <dl className="playground-facts" data-testid="route">
            <dt>Deployment</dt>
            <dd data-testid="route-deployment">
              {log.deployment_id ? <Link to={`/nodes/deployments/${log.deployment_id}`}>{log.deployment_name ?? `#${log.deployment_id} (deleted)`}</Link> : "none (refused before an engine)"}
            </dd>
            <dt>Version</dt>
            <dd data-testid="route-version">
              {log.model_version_id ? <Link to={`/models/versions/${log.model_version_id}`}>{log.model_version_name ?? `#${log.model_version_id}`}</Link> : "–"}
            </dd>
            <dt>Pool</dt>
            <dd data-testid="route-pool">{log.route_pool || "–"}</dd>
            <dt>Why</dt>
            <dd data-testid="route-reason">
              {log.route_reason ? (
                <ol className="playground-steps">
                  {routeSteps(log.route_reason).map((step) => (
                    <li key={step.raw} title={step.raw}>
                      {step.text}
                    </li>
                  ))}
                </ol>
              ) : (
                "–"
              )}
            </dd>
            <dt>Status</dt>
            <dd data-testid="route-status">{log.status}</dd>
          </dl>
        )}
        {p.requestId && (
          <p className="playground-request-id">
            Request{" "}
            <Link to={`/requests?request_id=${p.requestId}`} data-testid="route-request-id">
              {p.requestId}
            </Link>{" "}
            in the request log
          </p>
        )}
      </div>
    </div>
  );
}

export function PlaygroundPage() {
  const serving = useApi<AliasServing[]>("/api/routing/serving/");
  const [key, setKey] = useState<HeldKey | null>(null);
  const [compare, setCompare] = useState(false);
  const [a, setA] = useState<Target>({ alias: "", version: "" });
  const [b, setB] = useState<Target>({ alias: "", version: "" });
  const [system, setSystem] = useState("You are a helpful assistant.");
  const [user, setUser] = useState("");
  const [temperature, setTemperature] = useState("0.7");
  const [maxTokens, setMaxTokens] = useState("128");
  const [runs, setRuns] = useState<Run[]>([]);
  const [errors, setErrors] = useState<FieldErrors>({});
  const [busy, setBusy] = useState(false);
  const abort = useRef<AbortController | null>(null);

  const aliases = serving.data ?? [];
  const first = aliases[0]?.alias_name ?? "";
  const targetA = a.alias ? a : { alias: first, version: "" };
  const targetB = b.alias ? b : { alias: first, version: "" };

  const send = async (event: FormEvent) => {
    event.preventDefault();
    const local: FieldErrors = {};
    if (!key?.value) local.key = ["Paste a tenant's API key, or make a playground key."];
    if (!targetA.alias) local.target_a = ["No model is served yet."];
    if (!user.trim()) local.user = ["Write a message to send."];
    const temp = temperature.trim() === "" ? null : Number(temperature);
    const max = maxTokens.trim() === "" ? null : Number(maxTokens);
    if (Object.keys(local).length) {
      setErrors(local);
      return;
    }
    setErrors({});
    setBusy(true);
    abort.current?.abort();
    const controller = new AbortController();
    abort.current = controller;
    const targets = compare ? [targetA, targetB] : [targetA];
    // A follow-up continues each side's own conversation: its earlier turns and its own answers.
    const histories = targets.map((_, i) => {
      const prev = runs[i];
      return prev && prev.progress.done && !prev.progress.error ? [...prev.history, { role: "user" as const, content: prev.user }, { role: "assistant" as const, content: prev.progress.text }] : (prev?.history ?? []);
    });
    setRuns(targets.map((t, i) => ({ target: t, history: histories[i] ?? [], user, label: targetLabel(t, serving.data), progress: emptyProgress(), log: null, logMissing: false })));
    const update = (i: number, change: Partial<Run>) => setRuns((prev) => prev.map((r, n) => (n === i ? { ...r, ...change } : r)));
    // Both targets at once: the same prompt, started together, streamed side by side.
    await Promise.all(
      targets.map(async (t, i) => {
        const done = await streamChat(
          {
            key: key!.value,
            alias: t.alias,
            version: t.version ? Number(t.version) : null,
            system,
            history: histories[i] ?? [],
            user,
            // A value that is no number goes as typed, so the proxy's own check names the field.
            temperature: temp === null || Number.isNaN(temp) ? temperature.trim() || null : temp,
            maxTokens: max === null || Number.isNaN(max) ? maxTokens.trim() || null : max,
          },
          (progress) => update(i, { progress }),
          controller.signal,
        );
        if (done.error) {
          const field = fieldOf(done.error.param, i === 0 ? "a" : "b");
          if (field) setErrors((prev) => ({ ...prev, [field]: [done.error!.message] }));
        }
        if (done.requestId) {
          try {
            const log = await findLogRow(done.requestId);
            update(i, { log, logMissing: log === null });
          } catch (err) {
            update(i, { logMissing: true });
            setErrors((prev) => ({ ...prev, log: [errorMessage(err)] }));
          }
        }
      }),
    );
    setBusy(false);
  };

  return (
    <Page title="Playground" subtitle="Send a chat to a model as a tenant would, through the proxy: streamed, with its route and timing.">
      <ErrorState error={serving.error} onRetry={serving.reload} />
      <div className="playground-layout">
        <div className="playground-side">
          <KeyCard held={key} onKey={setKey} />
          {errors.key && (
            <div className="notice notice-warn" role="alert" data-testid="key-error">
              {errors.key.join(" ")}
            </div>
          )}
          <form onSubmit={send} className="card playground-form" data-testid="playground-form" noValidate>
            <div className="card-body">
              <CheckboxField label="Compare two targets side by side" name="compare" checked={compare} onChange={(e) => {
                  setCompare(e.target.checked);
                  setRuns([]); // another layout, another conversation
                }}
              />
              <TargetPicker side="a" target={targetA} serving={aliases} errors={errors} onChange={setA} />
              {compare && <TargetPicker side="b" target={targetB} serving={aliases} errors={errors} onChange={setB} />}
              <TextareaField label="System prompt" name="system" value={system} onChange={(e) => setSystem(e.target.value)} rows={2} />
              <TextareaField
                label="Message"
                name="user"
                errors={errors}
                value={user}
                onChange={(e) => setUser(e.target.value)}
                rows={3}
                hint={runs.length > 0 ? "Sent after the conversation so far; New conversation starts over." : undefined}
              />
              <div className="grid-2">
                <InputField label="Temperature" name="temperature" errors={errors} inputMode="decimal" value={temperature} onChange={(e) => setTemperature(e.target.value)} />
                <InputField label="Max tokens" name="max_tokens" errors={errors} inputMode="numeric" value={maxTokens} onChange={(e) => setMaxTokens(e.target.value)} />
              </div>
              <div className="playground-actions">
                <button type="submit" className="btn btn-primary" disabled={busy}>
                  {busy ? "Sending…" : compare ? "Send to both" : "Send"}
                </button>
                {busy && (
                  <button type="button" className="btn" onClick={() => abort.current?.abort()}>
                    Stop
                  </button>
                )}
                {!busy && runs.length > 0 && (
                  <button type="button" className="btn" onClick={() => setRuns([])}>
                    New conversation
                  </button>
                )}
              </div>
            </div>
          </form>
        </div>
        <div className={runs.length > 1 ? "playground-runs playground-compare" : "playground-runs"} data-testid="playground-runs">
          {runs.length === 0 && <div className="card playground-empty muted">The answer streams here, with the route it took and its timing.</div>}
          {runs.map((run, i) => (
            <RunPane key={i} run={run} side={i === 0 ? "a" : "b"} />
          ))}
        </div>
      </div>
    </Page>
  );
}
