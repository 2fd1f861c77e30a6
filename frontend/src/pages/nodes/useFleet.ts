// Hosts and deployments from the API, kept current by the live feed: the lists are re-read when any
// host or deployment changes state, and whenever the socket (re)connects (what changed while it was
// away is in the database). Metrics come live in `live`.
import { useEffect } from "react";
import { useApi } from "../../hooks/useApi";
import type { Page as ApiPage, Deployment, Host } from "../../api/types";
import { useFleetLive } from "./useFleetLive";

export function useFleet() {
  const hosts = useApi<ApiPage<Host>>("/api/hosts/", { limit: 200 });
  const deployments = useApi<ApiPage<Deployment>>("/api/deployments/", { limit: 200 });
  const live = useFleetLive([], (event) => {
    if (event.type === "deployment.state" || event.type === "host.state") {
      deployments.reload();
      hosts.reload();
    }
  });
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
