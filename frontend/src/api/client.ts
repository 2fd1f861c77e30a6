// The one way the console talks to the API: session cookie, CSRF header on writes, typed errors.

/** Field errors flattened to dotted paths: {"quota.requests_per_minute": ["..."]}. */
export type FieldErrors = Record<string, string[]>;

const NOT_ALLOWED = "Your role does not allow this action.";

/** An error from the API, with DRF field errors flattened so forms can show them next to their fields. */
export class ApiError extends Error {
  readonly status: number;
  readonly fieldErrors: FieldErrors;
  readonly body: unknown;

  constructor(status: number, message: string, fieldErrors: FieldErrors = {}, body: unknown = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.fieldErrors = fieldErrors;
    this.body = body;
  }

  /** Errors not tied to one field (`non_field_errors`, `detail`), or the message itself. */
  get generalErrors(): string[] {
    const general = [...(this.fieldErrors["non_field_errors"] ?? []), ...(this.fieldErrors["detail"] ?? [])];
    if (general.length === 0 && Object.keys(this.fieldErrors).length === 0) return [this.message];
    return general;
  }

  get isNotAllowed(): boolean {
    return this.status === 403;
  }
}

/** Flattens DRF's error body (nested dicts, lists of strings, lists of dicts for list fields). */
export function flattenErrors(body: unknown, prefix = "", out: FieldErrors = {}): FieldErrors {
  if (typeof body === "string") {
    (out[prefix || "non_field_errors"] ??= []).push(body);
  } else if (Array.isArray(body)) {
    body.forEach((item, index) => {
      if (typeof item === "string") (out[prefix || "non_field_errors"] ??= []).push(item);
      else if (item && typeof item === "object" && Object.keys(item).length > 0)
        flattenErrors(item, prefix ? `${prefix}.${index}` : String(index), out);
    });
  } else if (body && typeof body === "object") {
    for (const [name, value] of Object.entries(body)) {
      flattenErrors(value, prefix ? `${prefix}.${name}` : name, out);
    }
  }
  return out;
}

type UnauthenticatedListener = () => void;
const unauthenticatedListeners = new Set<UnauthenticatedListener>();

/** Called whenever the API says the session is gone; the auth provider sends the user to the login page. */
export function onUnauthenticated(listener: UnauthenticatedListener): () => void {
  unauthenticatedListeners.add(listener);
  return () => unauthenticatedListeners.delete(listener);
}

type OutageListener = (down: boolean) => void;
const outageListeners = new Set<OutageListener>();
let databaseDown = false;
// Requests are numbered as they are sent. An answer clears the outage only if its request was sent after the
// one that reported it: a slow answer to a request sent before the database went down says nothing about now
// (a dashboard poll answered late used to take the banner down a moment after it went up).
let requestsSent = 0;
let outageReportedBy = 0;

/** Called with true when the API says the database is unavailable (503 `database_unavailable`) and with
 * false on the next answer that worked; a listener hears the current state at once. */
export function onDatabaseOutage(listener: OutageListener): () => void {
  outageListeners.add(listener);
  listener(databaseDown);
  return () => outageListeners.delete(listener);
}

function setDatabaseDown(down: boolean, requestNumber: number): void {
  if (down) outageReportedBy = Math.max(outageReportedBy, requestNumber);
  else if (requestNumber < outageReportedBy) return;
  if (down === databaseDown) return;
  databaseDown = down;
  outageListeners.forEach((listener) => listener(down));
}

function readCookie(name: string): string | null {
  for (const part of document.cookie.split(";")) {
    const [key, ...rest] = part.trim().split("=");
    if (key === name) return decodeURIComponent(rest.join("="));
  }
  return null;
}

async function csrfToken(refresh = false): Promise<string> {
  const cookie = readCookie("csrftoken");
  if (cookie && !refresh) return cookie;
  const response = await fetch("/api/auth/csrf/", { credentials: "same-origin" });
  const body = (await response.json()) as { csrfToken: string };
  return readCookie("csrftoken") ?? body.csrfToken;
}

export type Query = Record<string, string | number | boolean | null | undefined | readonly (string | number)[]>;

/** `/api/tenants/` + {limit: 25, search: ""} -> `/api/tenants/?limit=25` (empty values dropped; a list repeats
 * its name: {subject: ["a", "b"]} -> `subject=a&subject=b`). */
export function withQuery(path: string, query?: Query): string {
  if (!query) return path;
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value === undefined || value === null || value === "") continue;
    if (Array.isArray(value)) for (const item of value) params.append(name, String(item));
    else params.set(name, String(value));
  }
  const qs = params.toString();
  return qs ? `${path}?${qs}` : path;
}

async function parseBody(response: Response): Promise<unknown> {
  if (response.status === 204) return null;
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
  }
}

async function sessionIsAlive(): Promise<boolean> {
  const response = await fetch("/api/auth/me/", { credentials: "same-origin", headers: { Accept: "application/json" } });
  return response.ok;
}

async function request<T>(method: string, path: string, body?: unknown, retried = false): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json" };
  const unsafe = method !== "GET" && method !== "HEAD";
  if (unsafe) headers["X-CSRFToken"] = await csrfToken();
  // FormData (a file upload) sets its own multipart Content-Type with the boundary.
  const form = body instanceof FormData;
  if (body !== undefined && !form) headers["Content-Type"] = "application/json";
  const requestNumber = ++requestsSent;
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : form ? body : JSON.stringify(body),
  });
  if (response.ok) {
    setDatabaseDown(false, requestNumber);
    return (await parseBody(response)) as T;
  }

  const data = await parseBody(response);
  const detail =
    data && typeof data === "object" && "detail" in data && typeof data.detail === "string" ? data.detail : "";
  if (response.status === 503 && data && typeof data === "object" && "code" in data) {
    if (data.code === "database_unavailable") setDatabaseDown(true, requestNumber);
  }
  if (response.status === 403 && unsafe && !retried && detail.startsWith("CSRF Failed")) {
    await csrfToken(true); // the token rotates at login; fetch a fresh one and try once more
    return request<T>(method, path, body, true);
  }
  if (response.status === 401 || response.status === 403) {
    // DRF answers 403 both for "not signed in" and "not allowed"; ask who we are to tell them apart.
    const signedIn = path !== "/api/auth/me/" && (await sessionIsAlive());
    if (!signedIn) {
      if (path !== "/api/auth/me/") unauthenticatedListeners.forEach((listener) => listener());
      throw new ApiError(401, "Please sign in.", {}, data);
    }
    throw new ApiError(403, detail || NOT_ALLOWED, {}, data);
  }
  const fieldErrors = response.status === 400 ? flattenErrors(data) : {};
  const message =
    detail ||
    (response.status === 400
      ? "Please correct the errors below."
      : `The server answered ${response.status} ${response.statusText}.`);
  throw new ApiError(response.status, message, fieldErrors, data);
}

/** Typed calls for every API path; T comes from src/api/types.ts. */
export const api = {
  get: <T>(path: string, query?: Query) => request<T>("GET", withQuery(path, query)),
  post: <T>(path: string, body?: unknown) => request<T>("POST", path, body ?? {}),
  patch: <T>(path: string, body: unknown) => request<T>("PATCH", path, body),
  put: <T>(path: string, body: unknown) => request<T>("PUT", path, body),
  /** T is null for the usual 204; a few deletes answer the changed object. */
  delete: <T = null>(path: string) => request<T>("DELETE", path),
  /** A multipart POST (file uploads); fields are the form's parts. */
  postForm: <T>(path: string, form: FormData) => request<T>("POST", path, form),
};

/** A readable one-line message for any thrown value. */
export function errorMessage(error: unknown): string {
  if (error instanceof ApiError) return error.generalErrors.join(" ") || error.message;
  if (error instanceof Error) return error.message;
  return String(error);
}
