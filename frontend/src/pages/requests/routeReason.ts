// A request-log route reason in words. The proxy writes it as "; "-separated steps, in the order it
// decided (routing/proxy/pipeline/route.py and call.py): the chain's note, how the pool was chosen, a
// canary draw, fallback or spill, the scorer's pick, retries. Rules are numbered from 1, as the Routing
// page lists them. A step this does not know is shown as written.

export interface RouteStep {
  /** The step in words. */
  text: string;
  /** The step as the proxy wrote it. */
  raw: string;
  /** The console page that explains it (the Routing page for policies and pools), if any. */
  link?: string;
}

const SCORERS = ["least_outstanding", "best_fit", "prefix_affinity", "session_affinity", "weighted", "round_robin", "random"];

function explain(raw: string): Pick<RouteStep, "text" | "link"> {
  let m: RegExpMatchArray | null;
  if ((m = raw.match(/^policy (.+) rule (\d+)$/))) return { text: `Policy “${m[1]}”: rule ${m[2]} matched`, link: "/routing" };
  if ((m = raw.match(/^policy (.+) default$/))) return { text: `Policy “${m[1]}”: no rule matched, its default pool`, link: "/routing" };
  if (raw === "alias pool") return { text: "The model's own pool (no policy)", link: "/routing" };
  if (raw === "no pool") return { text: "No pool for this model" };
  if (raw === "chain branch") return { text: "Pool chosen by the chain's branch stage" };
  if (raw === "chain generate step") return { text: "Pool named by the chain's generate step" };
  if (raw === "cache hit") return { text: "Answered from the chain's cache (no engine)" };
  if ((m = raw.match(/^chain (.+) v(\d+)(?: \((.*)\))?$/))) {
    return { text: `Stage chain “${m[1]}” v${m[2]}${m[3] ? `: ${m[3].replace(/->/g, "→")}` : ""}`, link: "/routing/chains" };
  }
  if ((m = raw.match(/^canary ([\d.]+)%$/))) return { text: `Canary: drawn for the candidate version (${m[1]}% share)`, link: "/rollouts" };
  if ((m = raw.match(/^fallback (.+)$/))) return { text: `Fallback to pool ${m[1]} (the chosen pool had no healthy engine)`, link: "/routing" };
  if ((m = raw.match(/^spill (\S+)(?: (.*))?$/))) return { text: `Spilled onto pool ${m[1]}${m[2] ? ` (${m[2]})` : ""}`, link: "/routing" };
  if ((m = raw.match(/^pinned version (.+)$/))) return { text: `Version ${m[1]} named by the request (x-inferchain-version)` };
  if ((m = raw.match(/^retry (\d+)$/))) return { text: `Retry ${m[1]} (an earlier engine failed)` };
  const scorer = SCORERS.find((s) => raw === s || raw.startsWith(`${s} `));
  if (scorer) {
    const why = raw.slice(scorer.length).trim();
    return { text: `Engine picked by ${scorer.replace(/_/g, " ")}${why ? ` (${why})` : ""}` };
  }
  return { text: raw };
}

/** The reason's steps, in the order the proxy took them. */
export function routeSteps(reason: string): RouteStep[] {
  return reason
    .split(";")
    .map((part) => part.trim())
    .filter(Boolean)
    .map((raw) => ({ raw, ...explain(raw) }));
}
