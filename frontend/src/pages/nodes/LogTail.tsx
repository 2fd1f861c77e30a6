// An engine's log tail with its health-probe lines folded: the agent asks every engine for /health (or
// llama.cpp's /docs), /v1/models and /metrics each tick, and the access log of every kind (uvicorn's)
// records each answer, so a tail of 200 lines is mostly probes. Each run of them becomes one line with
// its count, which opens to show them.

// uvicorn's access line of a successful probe: `INFO:  127.0.0.1:5100 - "GET /health HTTP/1.1" 200 OK`.
const PROBE = /"GET \/(health|docs|openapi\.json|v1\/models|metrics|is_sleeping|ping|version)(\?[^" ]*)? HTTP\/[\d.]+" 2\d\d/;

export function isProbeLine(line: string): boolean {
  return PROBE.test(line);
}

export type LogPart = { kind: "lines"; lines: string[] } | { kind: "probes"; lines: string[] };

/** The lines in order, each run of probe lines one part of its own. */
export function foldProbeLines(lines: readonly string[]): LogPart[] {
  const parts: LogPart[] = [];
  for (const line of lines) {
    const kind = isProbeLine(line) ? "probes" : "lines";
    const last = parts[parts.length - 1];
    if (last && last.kind === kind) last.lines.push(line);
    else parts.push({ kind, lines: [line] });
  }
  return parts;
}

function probePaths(lines: readonly string[]): string {
  const paths = new Set<string>();
  for (const line of lines) {
    const match = PROBE.exec(line);
    if (match) paths.add(`/${match[1]}`);
  }
  return [...paths].join(", ");
}

export function LogTail({ lines, empty }: { lines: readonly string[]; empty: string }) {
  const parts = foldProbeLines(lines);
  const probes = parts.reduce((n, p) => n + (p.kind === "probes" ? p.lines.length : 0), 0);
  return (
    <div className="log-tail log-tail-folded" data-testid="log-tail" data-probe-lines={probes}>
      {lines.length === 0 && empty}
      {parts.map((part, i) =>
        part.kind === "lines" ? (
          <span key={i}>{part.lines.join("\n") + "\n"}</span>
        ) : (
          <details key={i} className="log-probes" data-testid="log-probes">
            <summary>
              {part.lines.length} health-probe line{part.lines.length === 1 ? "" : "s"} ({probePaths(part.lines)})
            </summary>
            {part.lines.join("\n") + "\n"}
          </details>
        ),
      )}
    </div>
  );
}
