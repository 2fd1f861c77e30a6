// Hosts and deployments from the API, kept current by the live feed: the lists are re-read when any
// host or deployment changes state, and whenever the socket (re)connects (what changed while it was
// away is in the database). Metrics come live in `live`.
import { useEffect, useRef } from "react";
import type { Query } from "../../api/client";
import { useApi } from "../../hooks/useApi";
import type { Page as ApiPage, Deployment, Host } from "../../api/types";
import { useFleetLive } from "./useFleetLive";

const RELOAD_AT_MOST_EVERY_MS = 500;

/** One page of hosts and one of deployments, as `hostQuery` and `deploymentQuery` ask (server-side paging,
 * filters, search and ordering: a fleet of thousands is never loaded whole). */
export function useFleet(hostQuery: Query = { limit: 200 }, deploymentQuery: Query = { limit: 200 }) {
  const hosts = useApi<ApiPage<Host>>("/api/hosts/", hostQuery);
  const deployments = useApi<ApiPage<Deployment>>("/api/deployments/", deploymentQuery);
  // A big fleet's agents report state changes many times a second: one re-read per half second at most.
  const pending = useRef<number | null>(null);
  const live = useFleetLive([], (event) => {
    if ((event.type === "deployment.state" || event.type === "host.state") && pending.current === null) {
      pending.current = window.setTimeout(() => {
        pending.current = null;
        deployments.reload();
        hosts.reload();
      }, RELOAD_AT_MOST_EVERY_MS);
    }
  });
  useEffect(() => () => window.clearTimeout(pending.current ?? undefined), []);
  const { reload: reloadHosts } = hosts;
  const { reload: reloadDeployments } = deployments;
  useEffect(() => {
    if (live.connected) {
      reloadHosts();
      reloadDeployments();
    }
  }, [live.connected, reloadHosts, reloadDeployments]);
  return { hosts, deployments, live };
}
