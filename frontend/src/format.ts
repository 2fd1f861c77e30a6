// Small display helpers shared by pages.

export function formatDateTime(value: string | null | undefined): string {
  if (!value) return "—";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return value;
  return date.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

export function formatNumber(value: number | null | undefined, unlimited = "unlimited"): string {
  if (value === null || value === undefined) return unlimited;
  return value.toLocaleString();
}

/** `<input type="datetime-local">` value -> ISO string in UTC (the API's filters take ISO 8601). */
export function localInputToIso(value: string): string {
  if (!value) return "";
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? "" : date.toISOString();
}

/** ISO string -> `<input type="datetime-local">` value in the browser's zone. */
export function isoToLocalInput(value: string | null | undefined): string {
  if (!value) return "";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return "";
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

/** Compact form for table cells: "Nov 29, 08:09", with the year only when it is not this year. */
export function formatShortDateTime(value: string | null | undefined): string {
  if (!value) return "—";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return value;
  const sameYear = date.getFullYear() === new Date().getFullYear();
  return date.toLocaleString(undefined, {
    year: sameYear ? undefined : "numeric",
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    hour12: false,
  });
}

/** Bytes in binary units with three significant digits: "512 B", "1.50 KiB", "14.9 GiB", "80.0 GiB". */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${value.toFixed(0)} B`;
  const digits = Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** A parameter count: "8.03 B", "135.0 M". */
export function formatParams(count: number | null | undefined): string {
  if (!count) return "—";
  if (count >= 1e9) return `${(count / 1e9).toFixed(2)} B`;
  if (count >= 1e6) return `${(count / 1e6).toFixed(1)} M`;
  return count.toLocaleString();
}

/** A duration in seconds: "85 ms" below one second, "1.25 s" above. */
export function formatSeconds(value: number | null | undefined): string {
  if (value === null || value === undefined) return "—";
  return value < 1 ? `${(value * 1000).toFixed(0)} ms` : `${value.toFixed(2)} s`;
}

/** A 0..1 fraction as a percentage: whole above 10 %, one decimal below it and just under 100 %, so that
 * a KV cache 0.4 % used reads "0.4%", not "0%", and one 99.6 % used is not shown full. */
export function formatPct(fraction: number | null | undefined): string {
  if (fraction === null || fraction === undefined) return "—";
  const pct = fraction * 100;
  if (pct > 0 && pct < 0.1) return "<0.1%";
  if (pct > 0 && pct < 10) return `${pct.toFixed(1)}%`;
  if (pct > 99 && pct < 100) return `${(Math.floor(pct * 10) / 10).toFixed(1)}%`;
  return `${pct.toFixed(0)}%`;
}

/** Seconds since an ISO time, for heartbeat ages. */
export function ageSeconds(iso: string | null): number | null {
  if (!iso) return null;
  return Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
}

/** Where a page shows times: the browser's zone or UTC. */
export type TimeZoneChoice = "local" | "utc";

const pad2 = (n: number) => String(n).padStart(2, "0");

/** "2025-03-04 05:06:07.891": a log timestamp to the millisecond, in the browser's zone or in UTC. */
export function formatTimestamp(value: string | null | undefined, zone: TimeZoneChoice = "local"): string {
  if (!value) return "—";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return value;
  const utc = zone === "utc";
  const y = utc ? date.getUTCFullYear() : date.getFullYear();
  const mo = (utc ? date.getUTCMonth() : date.getMonth()) + 1;
  const d = utc ? date.getUTCDate() : date.getDate();
  const h = utc ? date.getUTCHours() : date.getHours();
  const mi = utc ? date.getUTCMinutes() : date.getMinutes();
  const s = utc ? date.getUTCSeconds() : date.getSeconds();
  const ms = String(utc ? date.getUTCMilliseconds() : date.getMilliseconds()).padStart(3, "0");
  return `${y}-${pad2(mo)}-${pad2(d)} ${pad2(h)}:${pad2(mi)}:${pad2(s)}.${ms}`;
}

/** The zone times are shown in: "UTC", or the browser's as "UTC+02:00 Europe/Berlin" (its offset at `at`;
 * `short`: the offset alone). */
export function zoneLabel(zone: TimeZoneChoice, at: Date = new Date(), short = false): string {
  if (zone === "utc") return "UTC";
  const offset = -at.getTimezoneOffset();
  const sign = offset < 0 ? "-" : "+";
  const abs = Math.abs(offset);
  const name = Intl.DateTimeFormat().resolvedOptions().timeZone;
  const utcOffset = `UTC${sign}${pad2(Math.floor(abs / 60))}:${pad2(abs % 60)}`;
  return !short && name && name !== "UTC" && name !== "Etc/UTC" ? `${utcOffset} ${name}` : utcOffset;
}

/** `<input type="datetime-local" step="1">` value, read in `zone`, -> ISO string in UTC. */
export function zonedInputToIso(value: string, zone: TimeZoneChoice): string {
  if (!value) return "";
  const date = new Date(zone === "utc" ? `${value}Z` : value);
  return Number.isNaN(date.getTime()) ? "" : date.toISOString();
}

/** ISO string -> `<input type="datetime-local" step="1">` value in `zone`, to the second. */
export function isoToZonedInput(value: string | null | undefined, zone: TimeZoneChoice): string {
  if (!value) return "";
  const text = formatTimestamp(value, zone);
  return text === value || text === "—" ? "" : text.slice(0, 19).replace(" ", "T");
}
