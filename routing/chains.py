"""Stage chains: the checks a chain must pass when it is saved, and its version history.

The JSON form and its per-stage checks are routing/proxy/stagespec.py (the proxy parses with the same
code); here are the checks that need the database: every pool a stage points at has a ready
deployment, the pools of remote calls (remote stages, model classifiers) are of role cpu-postprocess,
included chains exist and form no cycle, and every chain that applies to requests (has an alias or a
tenant) ends up with exactly one generate step, this one and every chain that includes it.
"""

from __future__ import annotations

from typing import Any

from nodes.choices import DeploymentState
from nodes.models import Deployment
from routing.models import RoutePool, StageChain, StageChainVersion
from routing.proxy.stagespec import (
    CPU_ROLE,
    ChainError,
    StageSpec,
    cpu_pools_named,
    expand,
    parse_stages,
    pools_named,
    split,
)


def _pool_problem(pool: str) -> str | None:
    row = RoutePool.objects.filter(name=pool).first()
    alias, role = (row.alias, row.role) if row else (pool, "")
    ready = Deployment.objects.filter(served_model_name=alias, state=DeploymentState.READY)
    if role:
        ready = ready.filter(role=role)
    if ready.exists():
        return None
    if row is None and not Deployment.objects.filter(served_model_name=pool).exists():
        return f"no pool named '{pool}'"
    return f"the pool '{pool}' is empty (no ready deployment serves '{alias}'{f' as {role}' if role else ''})"


def _cpu_pool_problem(pool: str) -> str | None:
    """Why a remote call may not go to `pool` (already known to exist and to be non-empty), or None.

    A RoutePool must be of role cpu-postprocess; a served name with no RoutePool (the alias's implicit
    pool) must be served only by cpu-postprocess deployments, or GPU engines would get the stage's work.
    """
    row = RoutePool.objects.filter(name=pool).first()
    if row is not None:
        if row.role == CPU_ROLE:
            return None
        return (
            f"the pool '{pool}' of role '{row.role or 'none'}'; a remote call needs a pool of role "
            f"{CPU_ROLE} (set the pool's role, or point the stage at a CPU pool)"
        )
    roles = set(
        Deployment.objects.filter(served_model_name=pool, state=DeploymentState.READY).values_list(
            "role", flat=True
        )
    )
    if roles == {CPU_ROLE}:
        return None
    others = ", ".join(sorted(r or "none" for r in roles - {CPU_ROLE}))
    return (
        f"'{pool}', which is also served by deployments of role {others}; a remote call needs a pool of "
        f"role {CPU_ROLE} (create a RoutePool with that role)"
    )


def _includes(chain: str, wanted: str, chains: dict[str, list[StageSpec]], seen: set[str]) -> bool:
    if chain in seen:
        return False
    seen.add(chain)
    for stage in chains.get(chain, []):
        if stage.kind == "chain":
            inner = stage.config["chain"]
            if inner == wanted or _includes(inner, wanted, chains, seen):
                return True
    return False


def check_chain(name: str, raw: Any, *, scoped: bool, pk: int | None = None) -> list[StageSpec]:
    """The chain's parsed stages, or ChainError saying why it cannot be saved."""
    stages = parse_stages(raw)
    chains: dict[str, list[StageSpec]] = {}
    scoped_names = {name} if scoped else set()
    rows = StageChain.objects.only("name", "stages", "alias", "tenant_id")
    if pk is not None:
        rows = rows.exclude(pk=pk)
    for row in rows:
        try:
            chains[row.name] = parse_stages(row.stages)
        except ChainError:
            continue  # an older row that no longer parses applies to nothing; it cannot be included
        if row.alias or row.tenant_id is not None:
            scoped_names.add(row.name)
    chains[name] = stages
    expanded = expand(name, chains)
    generates = [s for s in expanded if s.kind == "generate"]
    if scoped or generates:
        split(expanded)  # exactly one generate step
    for stage, pool in pools_named(expanded):
        problem = _pool_problem(pool)
        if problem is not None:
            raise ChainError(f"stage '{stage}' points at {problem}.")
    for stage, pool in cpu_pools_named(expanded):
        problem = _cpu_pool_problem(pool)
        if problem is not None:
            raise ChainError(f"stage '{stage}' points at {problem}.")
    # Chains that include this one must still hold together with its new stages.
    for other in sorted(scoped_names - {name}):
        if not _includes(other, name, chains, set()):
            continue
        try:
            split(expand(other, chains))
        except ChainError as exc:
            raise ChainError(f"chain '{other}' includes this one, and then {exc}") from None
    return stages


def record_version(chain: StageChain, actor: Any) -> StageChainVersion:
    """Keep the chain as just saved as its version `chain.version`."""
    return StageChainVersion.objects.create(
        chain=chain,
        version=chain.version,
        stages=chain.stages,
        alias=chain.alias,
        tenant_id=chain.tenant_id,
        enabled=chain.enabled,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
