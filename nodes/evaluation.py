"""The fleet's side of evaluation runs: deployment ids to endpoints (models_registry.evaluation.endpoints).

Registered at start-up by NodesConfig.ready(), since the registry may not import the fleet.
"""

from __future__ import annotations

from models_registry.evaluation.endpoints import Endpoint
from nodes.choices import DeploymentState
from nodes.lifecycle import engine_api_key
from nodes.models import Deployment


class FleetResolver:
    def endpoint(self, deployment_id: int) -> Endpoint | None:
        dep = (
            Deployment.objects.select_related("host", "model_version__model").filter(pk=deployment_id).first()
        )
        if dep is None:
            return None
        version = dep.model_version
        return Endpoint(
            base_url=dep.base_url,
            model=dep.served_model_name,
            api_key=engine_api_key(dep),
            info={
                "deployment": dep.name,
                "host": dep.host.name,
                "engine": dep.engine,
                "model_version_id": version.pk,
                "model": version.model.name,
                "revision": version.revision,
                "manifest_digest": version.manifest_digest,
                "quantization_id": dep.quantization_id,
                "launch_argv": list(dep.launch_argv or []),
                "extra_args": list(dep.extra_args or []),
                "max_model_len": dep.max_model_len,
            },
            state=dep.state,
        )

    def deployment_of_version(self, model_version_id: int) -> int | None:
        dep = (
            Deployment.objects.filter(model_version_id=model_version_id, state=DeploymentState.READY)
            .order_by("id")
            .first()
        )
        return dep.pk if dep is not None else None

    def model_version_of(self, deployment_id: int) -> int | None:
        return Deployment.objects.filter(pk=deployment_id).values_list("model_version_id", flat=True).first()
