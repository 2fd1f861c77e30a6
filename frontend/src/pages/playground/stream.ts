// One playground chat, sent the way any client sends it: POST /v1/chat/completions with the tenant's key
// (held in this page's memory only), streamed as Server-Sent Events, so it takes the proxy's real path
// (auth, limits, routing, request log). A version is pinned with the `x-inferchain-version` header
// (routing/proxy/pin.py). The route decision is read afterwards from the request log by the answer's
// x-request-id; the timings are measured here, where the user waits.

export const VERSION_HEADER = "x-inferchain-version";

export interface ChatMessage {
  role: "user" | "assistant";
  content: string;
}

export interface ChatInput {
  key: string;
  alias: string;
  /** A model version id to pin, or null to let routing choose. */
  version: number | null;
  system: string;
  /** Earlier turns of this conversation (user and assistant), oldest first. */
  history: ChatMessage[];
  user: string;
  /** As typed when it is no number: the proxy's own check then names the field. */
  temperature: number | string | null;
  maxTokens: number | string | null;
}

/** The proxy's OpenAI-shaped error, with the request field it names (`param`). */
export interface ChatError {
  status: number;
  message: string;
  param: string | null;
  code: string | null;
}

export interface ChatProgress {
  text: string;
  requestId: string | null;
  /** Milliseconds from sending to the first text, to the last byte. */
  ttftMs: number | null;
  totalMs: number | null;
  promptTokens: number | null;
  completionTokens: number | null;
  chunks: number;
  finishReason: string | null;
  done: boolean;
  error: ChatError | null;
}

export function emptyProgress(): ChatProgress {
  return {
    text: "",
    requestId: null,
    ttftMs: null,
    totalMs: null,
    promptTokens: null,
    completionTokens: null,
    chunks: 0,
    finishReason: null,
    done: false,
    error: null,
  };
}

/** Output tokens per second after the first one arrived (the decode rate a user sees). */
export function tokensPerSecond(p: Pick<ChatProgress, "ttftMs" | "totalMs" | "completionTokens">): number | null {
  if (p.ttftMs === null || p.totalMs === null || !p.completionTokens) return null;
  const decodeMs = p.totalMs - p.ttftMs;
  if (p.completionTokens < 2 || decodeMs <= 0) return null;
  return ((p.completionTokens - 1) * 1000) / decodeMs;
}

function chatError(status: number, body: unknown): ChatError {
  const inner = body && typeof body === "object" && "error" in body ? (body as { error: unknown }).error : null;
  if (inner && typeof inner === "object") {
    const e = inner as { message?: unknown; param?: unknown; code?: unknown };
    return {
      status,
      message: typeof e.message === "string" ? e.message : `The proxy answered ${status}.`,
      param: typeof e.param === "string" ? e.param : null,
      code: typeof e.code === "string" ? e.code : null,
    };
  }
  return { status, message: `The proxy answered ${status}.`, param: null, code: null };
}

interface StreamChunk {
  choices?: Array<{ delta?: { content?: string | null }; finish_reason?: string | null }>;
  usage?: { prompt_tokens?: number; completion_tokens?: number } | null;
  error?: unknown;
}

/** Sends the chat and calls `onProgress` with the whole state after every event; resolves when done. */
export async function streamChat(input: ChatInput, onProgress: (p: ChatProgress) => void, signal?: AbortSignal): Promise<ChatProgress> {
  const state = emptyProgress();
  const emit = () => onProgress({ ...state });
  const started = performance.now();
  const messages = [
    ...(input.system.trim() ? [{ role: "system", content: input.system }] : []),
    ...input.history,
    { role: "user", content: input.user },
  ];
  const body: Record<string, unknown> = {
    model: input.alias,
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (input.temperature !== null) body.temperature = input.temperature;
  if (input.maxTokens !== null) body.max_tokens = input.maxTokens;
  const headers: Record<string, string> = {
    Authorization: `Bearer ${input.key}`,
    "Content-Type": "application/json",
    Accept: "text/event-stream",
  };
  if (input.version !== null) headers[VERSION_HEADER] = String(input.version);

  let response: Response;
  try {
    // credentials "omit": the data plane authenticates by key only, never by the console's session.
    response = await fetch("/v1/chat/completions", { method: "POST", headers, body: JSON.stringify(body), credentials: "omit", signal });
  } catch (err) {
    const stopped = signal?.aborted ?? false;
    state.error = { status: 0, message: stopped ? "Stopped before the proxy answered." : `Could not reach the proxy: ${String(err)}`, param: null, code: stopped ? "stopped" : null };
    state.done = true;
    emit();
    return state;
  }
  state.requestId = response.headers.get("x-request-id");
  if (!response.ok || !response.body) {
    const text = await response.text();
    let parsed: unknown = null;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
    state.error = chatError(response.status, parsed);
    state.totalMs = performance.now() - started;
    state.done = true;
    emit();
    return state;
  }

  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const handle = (data: string) => {
    if (data === "[DONE]") return;
    let chunk: StreamChunk;
    try {
      chunk = JSON.parse(data) as StreamChunk;
    } catch {
      return;
    }
    if (chunk.error) {
      state.error = chatError(response.status, chunk);
      return;
    }
    for (const choice of chunk.choices ?? []) {
      const piece = choice.delta?.content ?? "";
      if (piece) {
        if (state.ttftMs === null) state.ttftMs = performance.now() - started;
        state.text += piece;
        state.chunks += 1;
      }
      if (choice.finish_reason) state.finishReason = choice.finish_reason;
    }
    if (chunk.usage) {
      state.promptTokens = chunk.usage.prompt_tokens ?? null;
      state.completionTokens = chunk.usage.completion_tokens ?? null;
    }
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut: number;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        for (const line of event.split(/\r?\n/)) {
          if (line.startsWith("data:")) handle(line.slice(5).trim());
        }
      }
      emit();
    }
  } catch (err) {
    // Stopped by the user (the proxy sees a client that left: 499 in the request log), or the connection broke.
    const stopped = signal?.aborted ?? false;
    state.error = { status: 0, message: stopped ? "Stopped before the answer was complete." : `The stream broke: ${String(err)}`, param: null, code: stopped ? "stopped" : null };
  }
  state.totalMs = performance.now() - started;
  state.done = true;
  emit();
  return state;
}
