// Stage kinds for the chain editor: the one list of kinds the console offers, and what it knows about each.
// A new kind (routing/proxy/stagespec.py KINDS; it reaches StageKind through the generated schema) needs one
// entry in STAGE_KINDS; without a form of its own (`form`), the editor shows its config as JSON.
import type { ChainStage, StageKind } from "../../api/types";

/** The kinds with a form of their own in the editor; any other kind is edited as JSON. */
export type FormKind = "generate" | "guard" | "classify" | "chain";

export interface StageKindInfo {
  kind: StageKind;
  label: string;
  /** One line under the kind in the "add a stage" menu and on the stage's card. */
  hint: string;
  /** The config a new stage of this kind starts with. */
  initial: () => Record<string, unknown>;
  /** Which form edits it; absent: the JSON editor. */
  form?: FormKind;
  /** Only allowed before the generate step: "Add stage" puts it there. */
  before?: boolean;
}

export const STAGE_KINDS: ReadonlyArray<StageKindInfo> = [
  { kind: "generate", label: "Generate", form: "generate", hint: "The one generation step: the pool that answers (or the alias's policy).", initial: () => ({}) },
  { kind: "guard", label: "Guard", form: "guard", hint: "Sensitive terms: block or mask them in the prompt (before generate) or the answer (after it).", initial: () => ({ terms: [""], regex: false, action: "block" }) },
  { kind: "classify", label: "Classify", form: "classify", before: true, hint: "Picks the pool from the content: the first rule that matches wins.", initial: () => ({ rules: [{ match: { keywords: [""] }, pool: "" }] }) },
  { kind: "cache", label: "Cache", before: true, hint: "Replays the answer to an identical deterministic request (temperature 0 or a seed) from Redis, per tenant.", initial: () => ({ ttl_s: 300 }) },
  { kind: "remote", label: "Remote (CPU pool)", hint: "A cpu-postprocess pool's model rewrites the prompt (before generate) or the answer (after it).", initial: () => ({ pool: "", instruction: "", timeout_ms: 2000, on_failure: "open" }) },
  { kind: "schema", label: "Schema check", hint: "Checks the answer against the client's response_format (JSON object or JSON schema).", initial: () => ({ hold: false }) },
  { kind: "chain", label: "Include chain", form: "chain", hint: "Another chain's stages in this place.", initial: () => ({ chain: "" }) },
];

export function kindInfo(kind: string): StageKindInfo | undefined {
  return STAGE_KINDS.find((k) => k.kind === kind);
}

/** A stage as the editor keeps it: a stable key for React, and for JSON-edited kinds the text being typed. */
export interface DraftStage {
  key: number;
  kind: StageKind;
  name: string;
  config: Record<string, unknown>;
  /** The JSON editor's text while the stage is edited as JSON (always, for kinds without a form);
   * `config` follows it whenever it parses, `jsonError` says why it does not. */
  json?: string;
  jsonError?: string;
}

let nextKey = 1;

export function draftStage(stage: ChainStage): DraftStage {
  const config = (stage.config ?? {}) as Record<string, unknown>;
  const form = kindInfo(stage.kind)?.form;
  return {
    key: nextKey++,
    kind: stage.kind,
    name: stage.name ?? "",
    config,
    json: form ? undefined : JSON.stringify(config, null, 2),
  };
}

export function newStage(kind: StageKind): DraftStage {
  return draftStage({ kind, config: kindInfo(kind)?.initial() ?? {} });
}

/** The name the server gives a stage saved without one (stagespec.parse_stages: kind + index). */
export function stageName(stage: DraftStage, index: number): string {
  return stage.name.trim() || `${stage.kind}${index}`;
}

const lines = (value: unknown): string[] =>
  Array.isArray(value) ? value.map((v) => String(v).trim()).filter((v) => v !== "") : [];

/** The stage as the API takes it: blank lines and empty conditions dropped, so the form's spare rows don't count. */
export function stageForApi(stage: DraftStage): ChainStage {
  let config: Record<string, unknown> = { ...stage.config };
  if (stage.kind === "guard") {
    config = { ...config, terms: lines(config.terms) };
  } else if (stage.kind === "classify") {
    const rules = Array.isArray(config.rules) ? (config.rules as ClassifyRule[]) : [];
    config = {
      ...config,
      rules: rules.map((rule) => {
        const match: Record<string, unknown> = {};
        for (const [name, value] of Object.entries(rule.match ?? {})) {
          if (name === "keywords") {
            const words = lines(value);
            if (words.length) match.keywords = words;
          } else if (value !== undefined && value !== null && value !== "") match[name] = value;
        }
        if (!("keywords" in match)) delete match.regex;
        return { ...rule, match };
      }),
    };
  } else if (stage.kind === "generate" && !config.pool) {
    delete config.pool;
  }
  const out: ChainStage = { kind: stage.kind, config };
  if (stage.name.trim()) out.name = stage.name.trim();
  return out;
}

export interface ClassifyRule {
  match?: Record<string, unknown>;
  pool?: string;
}

/** Which stage a server message is about: "stages[2]..." by index, "stage 'x'" / "classify stage 'x'" by name. */
export function stageOfError(message: string, stages: DraftStage[]): number | null {
  const byIndex = /^stages\[(\d+)\]/.exec(message);
  if (byIndex) {
    const index = Number(byIndex[1]);
    return index < stages.length ? index : null;
  }
  const byName = /stage '([^']+)'/.exec(message);
  if (byName) {
    const index = stages.findIndex((stage, i) => stageName(stage, i) === byName[1]);
    return index >= 0 ? index : null;
  }
  return null;
}

/** Which field of its stage a server message is about: "stages[0].config.terms[1] ..." -> "terms",
 * "stages[1].config.rules[2].match ..." -> "rules.2", "stages[0].name ..." -> "name"; null: the stage as a whole. */
export function fieldOfError(message: string): string | null {
  const config = /^stages\[\d+\]\.config\.(\w+)(?:\[(\d+)\])?/.exec(message);
  if (config) return config[1] === "rules" && config[2] !== undefined ? `rules.${config[2]}` : (config[1] ?? null);
  return /^stages\[\d+\]\.name\b/.test(message) ? "name" : null;
}

/** A classify rule's conditions in a few words, for the diagram ("keywords refund, invoice"). */
export function describeConditions(match: Record<string, unknown> | undefined): string {
  if (!match) return "always";
  const parts: string[] = [];
  const words = lines(match.keywords);
  if (words.length) parts.push(`${match.regex ? "regex" : "keywords"} ${words.join(", ")}`);
  if (match.min_prompt_tokens != null && match.min_prompt_tokens !== "") parts.push(`≥ ${String(match.min_prompt_tokens)} tokens`);
  if (match.max_prompt_tokens != null && match.max_prompt_tokens !== "") parts.push(`≤ ${String(match.max_prompt_tokens)} tokens`);
  if (match.min_messages != null && match.min_messages !== "") parts.push(`≥ ${String(match.min_messages)} messages`);
  if (match.max_messages != null && match.max_messages !== "") parts.push(`≤ ${String(match.max_messages)} messages`);
  if (typeof match.code === "boolean") parts.push(match.code ? "has code" : "no code");
  if (typeof match.images === "boolean") parts.push(match.images ? "has images" : "no images");
  return parts.length ? parts.join(" and ") : "always";
}

/** What a stage does in a few words, for the diagram and the chain list. */
export function describeStage(stage: DraftStage | ChainStage): string {
  const config = (stage.config ?? {}) as Record<string, unknown>;
  switch (stage.kind) {
    case "generate":
      return config.pool ? String(config.pool) : "alias's policy";
    case "guard": {
      const terms = lines(config.terms);
      return `${config.action === "mask" ? "mask" : "block"} ${terms.length} ${config.regex ? "pattern" : "term"}${terms.length === 1 ? "" : "s"}`;
    }
    case "classify": {
      const rules = Array.isArray(config.rules) ? config.rules.length : 0;
      return `${rules} rule${rules === 1 ? "" : "s"}`;
    }
    case "chain":
      return config.chain ? `stages of ${String(config.chain)}` : "no chain chosen";
    default:
      return Object.keys(config).length ? Object.keys(config).join(", ") : "no settings";
  }
}
