"""The proxy's in-memory view of configuration: keys, quotas, pools, policies, endpoints, tokenizers.

Everything here is loaded with the ORM off the event loop (in a thread) and then read on the hot path
without any database query. `load_routing_snapshot` builds the routing half; `load_key` resolves one
API key on a cache miss.
"""

from __future__ import annotations

import hmac
import logging
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Count

from console.models import ApiKey
from models_registry.models import ModelAlias
from nodes.choices import DeploymentState
from nodes.lifecycle import engine_key_for
from nodes.models import Deployment, Gpu
from routing.choices import Scorer
from routing.models import ACTIVE_ROLLOUT_STATES, Rollout, RoutePolicy, RoutePool, ShadowConfig, StageChain
from routing.proxy.predict import host_share
from routing.proxy.spill import Spill, parse_spill
from routing.proxy.stagespec import ChainError, StageSpec, expand, parse_stages, split

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """One scope's limits (tenant or key override); None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    daily_token_budget: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None

    @property
    def counted(self) -> bool:
        """Whether admission needs Redis at all for this scope."""
        # Spelled out, not any(genexpr): the limiter asks this twice per request.
        return (
            self.requests_per_minute is not None
            or self.tokens_per_minute is not None
            or self.max_concurrent_requests is not None
            or self.daily_token_budget is not None
        )


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What the proxy needs to know about one API key, copied out of the database."""

    id: int
    prefix: str
    hashed_key: str
    tenant_id: int
    tenant_name: str
    tenant_active: bool
    log_prompts: bool
    scopes: frozenset[str]
    expires_at: float | None
    revoked: bool
    tenant_limits: Limits
    key_limits: Limits
    # Whether the tenant lets its requests be mirrored to a shadow candidate (Tenant.shadow_consent).
    shadow_consent: bool = False
    # Its requests' latency class: the key's, else the tenant's, else PROXY_DEFAULT_SLO_CLASS.
    slo_class: str = ""

    def may_use(self, alias: str) -> bool:
        return not self.scopes or alias in self.scopes

    def scope_note(self) -> str:
        """What a refusal says about the key's scope: the aliases it may use (its own, nobody else's)."""
        if not self.scopes:
            return ""
        names = ", ".join(f"'{a}'" for a in sorted(self.scopes))
        return f" This key may use only: {names}."

    def max_input_tokens(self) -> int | None:
        return _min_set(self.tenant_limits.max_input_tokens, self.key_limits.max_input_tokens)

    def max_output_tokens(self) -> int | None:
        return _min_set(self.tenant_limits.max_output_tokens, self.key_limits.max_output_tokens)


def _min_set(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


@dataclass(slots=True)
class Endpoint:
    """One engine the proxy can send requests to (a ready deployment, or a static endpoint)."""

    id: str
    deployment_id: int | None
    base_url: str
    api_key: str
    served_model_name: str
    max_model_len: int | None
    block_size: int
    role: str = ""
    # The model version the deployment runs (None for a static endpoint, which serves whatever it serves).
    version_id: int | None = None
    # The deployment's engine ("vllm", "llamacpp", "sim"); empty for a static endpoint.
    engine: str = ""
    # Whether it answers /v1/embeddings: False when its engine cannot, None when unknown (vLLM decides
    # by the model it loads; static endpoints are whatever they are).
    embeddings: bool | None = None
    # A simulator counting with its built-in tokenizer (no --tokenizer of its own).
    sim_builtin_tokenizer: bool = False
    # The level a sleeping deployment sleeps at (0: awake); only Pool.sleeping holds sleeping ones.
    sleeping_level: int = 0
    # Its share of its host's cost per hour (routing.cost.host_share): what the `slo_cost` scorer
    # spreads over the tokens it generates. 0 for a static endpoint.
    cost_per_hour: float = 0.0


@dataclass(frozen=True, slots=True)
class Canary:
    """An active rollout as one pool sees it: `share` percent of its traffic goes to `endpoints`.

    Which requests are the share is decided per request by `routing.proxy.canary.draw` (sticky by the
    pool's session header or by tenant, see `sticky_by`). `endpoints` are the pool's ready endpoints of
    the candidate version (its `staged` ones); when none of them can take a request it goes to the
    pool's own endpoints, so a canary never makes a request fail for want of a candidate.
    """

    rollout_id: int
    version_id: int
    share: float  # percent, 0..100
    sticky_by: str  # StickyBy: "session" or "tenant"
    endpoints: list[Endpoint] = field(default_factory=list)
    version_label: str = ""
    # The hash salt of this rollout ("<id>:"), so two rollouts draw independent cohorts.
    salt: bytes = b""
    # `share` as an 8-byte big-endian bound: a request whose digest is below it goes to the candidate
    # (routing.proxy.canary), compared as bytes so the draw does no arithmetic.
    threshold: bytes = bytes(8)
    # The pool's session header, encoded once.
    session_header: bytes = b"x-session-id"


@dataclass(frozen=True, slots=True)
class Shadow:
    """An alias's shadow traffic: `percent` of consenting tenants' requests mirrored to `endpoints`."""

    config_id: int
    alias: str
    version_id: int
    percent: float
    max_inflight: int
    timeout_s: float
    endpoints: list[Endpoint] = field(default_factory=list)
    version_label: str = ""


@dataclass(slots=True)
class Pool:
    """A RoutePool with its endpoints resolved."""

    name: str
    alias: str
    scorer: str = Scorer.LEAST_OUTSTANDING
    weights: dict[str, float] = field(default_factory=dict)
    session_header: str = "x-session-id"
    connect_timeout_s: float = 2.0
    first_byte_timeout_s: float = 60.0
    inter_token_timeout_s: float = 30.0
    total_timeout_s: float = 600.0
    max_retries: int = 2
    max_inflight_per_endpoint: int = 64
    batch_max_fraction: float = 0.8
    # What requests go to: the pool's ready endpoints that run the alias's active version, or the
    # version the pool names (every one when the served name is no registry alias; static endpoints
    # always). Filtered when the snapshot is built, so version selection costs the hot path nothing.
    endpoints: list[Endpoint] = field(default_factory=list)
    # The version `endpoints` run (None: the served name is no registry alias): the alias's active
    # version, or the one the pool names (`pinned`: RoutePool.model_version).
    version_id: int | None = None
    pinned: bool = False
    version_label: str = ""  # "model@revision" of that version, for errors that name it
    # The pool's ready endpoints of its alias's other versions, by version id. They receive nothing
    # unless the alias's active rollout names one of them (`canary`).
    staged: dict[int, list[Endpoint]] = field(default_factory=dict)
    # The alias's active rollout (running, paused or holding), for pools that serve the active version
    # (a pool that names its version is left alone); None when there is none.
    canary: Canary | None = None
    # Its sleeping deployments (same version rule as `endpoints`): when no endpoint is awake, the proxy
    # asks for one of them to wake and holds the request up to `wake_timeout_s` (routing/proxy/wake.py).
    sleeping: list[Endpoint] = field(default_factory=list)
    wake_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Rule:
    """One branch of a policy: when every given condition holds, route to `pool`."""

    pool: str
    aliases: frozenset[str] | None = None
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None
    tasks: frozenset[str] | None = None
    tenants: frozenset[str] | None = None
    priority: str | None = None
    # Where the requests this rule sends may overflow while that pool has headroom (routing.proxy.spill).
    spill: Spill | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    alias: str
    rules: tuple[Rule, ...]
    default_pool: str | None
    fallback_pool: str | None
    # By pool name: the spill of the first rule that sends to that pool and names one. It applies to
    # every request this policy sends to the pool (routing.proxy.spill).
    spills: dict[str, Spill] = field(default_factory=dict)


def policy_spills(rules: tuple[Rule, ...]) -> dict[str, Spill]:
    spills: dict[str, Spill] = {}
    for rule in rules:
        if rule.spill is not None and rule.spill.pool != rule.pool:
            spills.setdefault(rule.pool, rule.spill)
    return spills


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """The active version behind an alias, as far as token counting needs it."""

    alias: str
    version_id: int | None
    tokenizer_path: str | None
    max_context: int | None
    # No tokenizer file and only simulated engines serve it: they count with the simulator's built-in
    # rule (vllm_sim.text), so the proxy counts with it too and gets their usage.prompt_tokens exactly.
    sim_tokens: bool = False
    # "model@revision" of the active version, for errors that name it.
    version_label: str = ""


@dataclass(slots=True)
class RoutingSnapshot:
    pools: dict[str, Pool] = field(default_factory=dict)
    policies: dict[str, Policy] = field(default_factory=dict)
    models: dict[str, ModelInfo] = field(default_factory=dict)
    # Every alias some endpoint serves: what /v1/models lists (filtered by key scopes).
    aliases: tuple[str, ...] = ()
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    # Aliases none of whose endpoints serve /v1/embeddings (the proxy answers that itself).
    no_embeddings: frozenset[str] = frozenset()
    # "model@revision" of every version some ready deployment runs (for errors that name versions).
    version_labels: dict[int, str] = field(default_factory=dict)
    # Enabled shadow configurations with a share above 0, by alias.
    shadows: dict[str, Shadow] = field(default_factory=dict)
    # Enabled stage chains by (tenant id or None, alias or ""): see chain_for.
    chains: dict[tuple[int | None, str], ChainSpec] = field(default_factory=dict)

    def chain_for(self, tenant_id: int, alias: str) -> ChainSpec | None:
        """The most specific chain: the tenant's for this alias, the tenant's for any, the alias's."""
        chains = self.chains
        return chains.get((tenant_id, alias)) or chains.get((tenant_id, "")) or chains.get((None, alias))


@dataclass(frozen=True, slots=True)
class ChainSpec:
    """One enabled chain, its includes expanded: pre-stages, the generate step, post-stages."""

    name: str
    version: int
    pre: tuple[StageSpec, ...]
    generate: StageSpec
    post: tuple[StageSpec, ...]


def _chains() -> dict[tuple[int | None, str], ChainSpec]:
    rows = list(StageChain.objects.all())
    parsed: dict[str, list[StageSpec]] = {}
    for row in rows:
        try:
            parsed[row.name] = parse_stages(row.stages)
        except ChainError as exc:  # the API checks; a hand-edited row must not break routing
            log.warning("stage chain %s: skipped: %s", row.name, exc)
    out: dict[tuple[int | None, str], ChainSpec] = {}
    for row in rows:
        if not row.enabled or (not row.alias and row.tenant_id is None) or row.name not in parsed:
            continue
        try:
            pre, generate, post = split(expand(row.name, parsed))
        except ChainError as exc:
            log.warning("stage chain %s: skipped: %s", row.name, exc)
            continue
        out[(row.tenant_id, row.alias)] = ChainSpec(row.name, row.version, tuple(pre), generate, tuple(post))
    return out


def parse_rule(raw: dict[str, Any]) -> Rule:
    """A Rule from its JSON form; raises ValueError on a malformed one (the API validates with this)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("pool"), str) or not raw["pool"]:
        raise ValueError("each rule needs a 'pool' name")
    match = raw.get("match") or {}
    if not isinstance(match, dict):
        raise ValueError("'match' must be an object")
    known = {"alias", "min_prompt_tokens", "max_prompt_tokens", "task", "tenant", "priority"}
    unknown = set(match) - known
    if unknown:
        raise ValueError(f"unknown match keys: {sorted(unknown)}")
    spill = parse_spill(raw.get("spill"))
    if spill is not None and spill.pool == raw["pool"]:
        raise ValueError("a rule cannot spill onto its own pool")

    def names(value: Any, label: str) -> frozenset[str] | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"'{label}' must be a string or a list of strings")
        return frozenset(value)

    def count(value: Any, label: str) -> int | None:
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"'{label}' must be a non-negative integer")
        return value

    priority = match.get("priority")
    if priority is not None and priority not in ("interactive", "batch"):
        raise ValueError("'priority' must be 'interactive' or 'batch'")
    return Rule(
        pool=raw["pool"],
        aliases=names(match.get("alias"), "alias"),
        min_prompt_tokens=count(match.get("min_prompt_tokens"), "min_prompt_tokens"),
        max_prompt_tokens=count(match.get("max_prompt_tokens"), "max_prompt_tokens"),
        tasks=names(match.get("task"), "task"),
        tenants=names(match.get("tenant"), "tenant"),
        priority=priority,
        spill=spill,
    )


def _limits(quota: Any) -> Limits:
    if quota is None:
        return Limits()
    # Quota.limits() names the same fields as Limits, so a new limit cannot be dropped here.
    return Limits(**quota.limits())


def key_info_from_model(api_key: Any) -> KeyInfo:
    tenant = api_key.tenant
    tenant_quota = getattr(tenant, "quota", None) if _has_related(tenant, "quota") else None
    key_quota = getattr(api_key, "quota_override", None) if _has_related(api_key, "quota_override") else None
    return KeyInfo(
        id=api_key.pk,
        prefix=api_key.prefix,
        hashed_key=api_key.hashed_key,
        tenant_id=tenant.pk,
        tenant_name=tenant.name,
        tenant_active=tenant.is_active,
        log_prompts=tenant.log_prompts,
        scopes=frozenset(api_key.scopes or []),
        expires_at=api_key.expires_at.timestamp() if api_key.expires_at else None,
        revoked=api_key.revoked_at is not None,
        tenant_limits=_limits(tenant_quota),
        key_limits=_limits(key_quota),
        shadow_consent=tenant.shadow_consent,
        slo_class=api_key.slo_class or tenant.slo_class or settings.PROXY_DEFAULT_SLO_CLASS,
    )


def _has_related(obj: Any, name: str) -> bool:
    try:
        return getattr(obj, name) is not None
    except Exception:  # RelatedObjectDoesNotExist: the reverse one-to-one is simply absent
        return False


def load_key(digest: str) -> KeyInfo | None:
    """Look one key up by its HMAC digest (sync: call it in a thread). None when unknown."""
    candidate = (
        ApiKey.objects.select_related("tenant", "tenant__quota", "quota_override")
        .filter(hashed_key=digest)
        .first()
    )
    if candidate is None or not hmac.compare_digest(candidate.hashed_key, digest):
        return None
    return key_info_from_model(candidate)


def load_keys(ids: list[int]) -> dict[int, KeyInfo]:
    """Fresh copies of the given keys (the periodic safety-net revalidation)."""
    rows = ApiKey.objects.select_related("tenant", "tenant__quota", "quota_override").filter(pk__in=ids)
    return {row.pk: key_info_from_model(row) for row in rows}


def _static_endpoints() -> list[Endpoint]:
    out: list[Endpoint] = []
    for n, item in enumerate(filter(None, (p.strip() for p in settings.PROXY_STATIC_ENDPOINTS.split(",")))):
        alias, _, rest = item.partition("=")
        url, _, engine_key = rest.partition("|")
        out.append(
            Endpoint(
                id=f"static-{n}",
                deployment_id=None,
                base_url=url.rstrip("/"),
                api_key=engine_key,
                served_model_name=alias,
                max_model_len=None,
                block_size=16,
            )
        )
    return out


def static_aliases() -> set[str]:
    """The aliases `PROXY_STATIC_ENDPOINTS` serves."""
    return {ep.served_model_name for ep in _static_endpoints()}


@dataclass(frozen=True, slots=True)
class DeploymentRow:
    """What the snapshot needs of one deployment, read as plain values: building model instances (and
    their host and version) for thousands of deployments took most of a full load's time."""

    pk: int
    state: str
    served_model_name: str
    host_name: str
    address: str
    port: int
    start_token: str
    max_model_len: int | None
    block_size: int | None
    role: str
    version_id: int
    model_name: str
    revision: str
    engine: str
    extra_args: list[str]
    sleeping_level: int
    host_cost_per_hour: Any = 0
    gpu_indices: list[int] | None = None
    host_id: int = 0
    # The host's GPU count (filled in by deployment_rows).
    host_gpus: int = 0

    @property
    def version_label(self) -> str:
        """The version's "model@revision", as str(ModelVersion) gives it."""
        return f"{self.model_name}@{self.revision}"


# DeploymentRow's fields in order, as `values_list` reads them.
_ROW_FIELDS = (
    "pk",
    "state",
    "served_model_name",
    "host__name",
    "host__address",
    "port",
    "start_token",
    "max_model_len",
    "block_size",
    "role",
    "model_version_id",
    "model_version__model__name",
    "model_version__revision",
    "engine",
    "extra_args",
    "sleeping_level",
    "host__cost_per_hour",
    "gpu_indices",
    "host_id",
)


def deployment_rows(rows: models.QuerySet[Deployment]) -> list[DeploymentRow]:
    """`rows` (a Deployment queryset) as DeploymentRows, in its order."""
    found = list(rows.values_list(*_ROW_FIELDS))
    hosts = {row[-1] for row in found}
    gpus = dict(
        Gpu.objects.filter(host_id__in=hosts)
        .values("host_id")
        .annotate(n=Count("id"))
        .values_list("host_id", "n")
    )
    return [DeploymentRow(*(*row, gpus.get(row[-1], 0))) for row in found]


def _endpoint(dep: DeploymentRow) -> Endpoint:
    """The Endpoint of one deployment."""
    args = dep.extra_args or []
    return Endpoint(
        id=str(dep.pk),
        deployment_id=dep.pk,
        base_url=f"http://{dep.address}:{dep.port}",
        api_key=engine_key_for(dep.pk, dep.start_token),
        served_model_name=dep.served_model_name,
        max_model_len=dep.max_model_len,
        block_size=dep.block_size or 16,
        role=dep.role,
        version_id=dep.version_id,
        engine=dep.engine,
        embeddings=_serves_embeddings(dep.engine, args),
        sim_builtin_tokenizer=dep.engine == "sim" and not _has_flag(args, "--tokenizer"),
        sleeping_level=dep.sleeping_level if dep.state == DeploymentState.SLEEPING else 0,
        cost_per_hour=float(dep.host_cost_per_hour or 0)
        * host_share(len(dep.gpu_indices or []), dep.host_gpus),
    )


# The deployment states a snapshot holds: ready ones route, sleeping ones can be woken.
ROUTED_STATES = (DeploymentState.READY, DeploymentState.SLEEPING)


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _serves_embeddings(engine: str, extra_args: list[str]) -> bool | None:
    if engine == "sim":
        return False  # the simulator generates text only, as vLLM does for a generative model
    if engine == "llamacpp":
        # llama-cpp-python's server computes embeddings only for a model loaded with --embedding.
        return _has_flag(extra_args, "--embedding")
    return None


def _models() -> dict[str, ModelInfo]:
    out: dict[str, ModelInfo] = {}
    for alias in ModelAlias.objects.select_related("active_version__model"):
        version = alias.active_version
        out[alias.name] = ModelInfo(
            alias=alias.name,
            version_id=version.pk if version else None,
            tokenizer_path=(version.tokenizer_path or None) if version else None,
            max_context=version.max_context if version else None,
            version_label=str(version) if version else "",
        )
    return out


def _split_by_version(
    endpoints: list[Endpoint], version: int | None, role: str = ""
) -> tuple[list[Endpoint], dict[int, list[Endpoint]]]:
    """The endpoints (of one served name, with `role` if given) that serve `version`, and the others
    by version.

    An endpoint serves when it runs that version, when no version is meant (the served name is no
    registry alias), or when it is static (no version known).
    """
    serving: list[Endpoint] = []
    staged: dict[int, list[Endpoint]] = {}
    for ep in endpoints:
        if role and ep.role != role:
            continue
        if ep.version_id is None or version is None or ep.version_id == version:
            serving.append(ep)
        else:
            staged.setdefault(ep.version_id, []).append(ep)
    return serving, staged


def _canaries() -> dict[str, Rollout]:
    """The active rollout of each alias (at most one, by a database constraint), by alias name."""
    rows = Rollout.objects.select_related("alias", "candidate_version__model").filter(
        state__in=[s.value for s in ACTIVE_ROLLOUT_STATES]
    )
    return {row.alias.name: row for row in rows}


def share_threshold(share: float) -> bytes:
    """The bound for `share` percent of 64-bit digests: those below it (as big-endian bytes) are the share.

    Exact (a fraction, rounded up): a digest d is below it exactly when d * 100 / 2**64 < share.
    """
    bound = math.ceil(Fraction(share) * (1 << 64) / 100)
    return max(0, min(bound, (1 << 64) - 1)).to_bytes(8, "big")


def _canary(rollout: Rollout | None, pool: Pool) -> Canary | None:
    if rollout is None or pool.pinned:
        return None
    share = max(0.0, min(100.0, float(rollout.share)))
    return Canary(
        rollout_id=rollout.pk,
        version_id=rollout.candidate_version_id,
        share=share,
        sticky_by=rollout.sticky_by,
        endpoints=list(pool.staged.get(rollout.candidate_version_id, [])),
        version_label=str(rollout.candidate_version),
        salt=f"{rollout.pk}:".encode(),
        threshold=share_threshold(share),
        session_header=pool.session_header.encode("latin-1"),
    )


def _shadow(row: ShadowConfig, ready: list[Endpoint]) -> Shadow:
    return Shadow(
        config_id=row.pk,
        alias=row.alias.name,
        version_id=row.candidate_version_id,
        percent=min(100.0, float(row.percent)),
        max_inflight=row.max_inflight,
        timeout_s=row.timeout_s,
        # Any ready deployment of the candidate under the alias's served name, whatever its role.
        endpoints=[ep for ep in ready if ep.version_id == row.candidate_version_id],
        version_label=str(row.candidate_version),
    )


def _policies() -> dict[str, Policy]:
    policies: dict[str, Policy] = {}
    for prow in RoutePolicy.objects.select_related("default_pool", "fallback_pool"):
        rules: list[Rule] = []
        for raw in prow.rules or []:
            try:
                rules.append(parse_rule(raw))
            except ValueError as exc:  # the API validates; a hand-edited row must not break routing
                log.warning("policy %s: skipping bad rule %r: %s", prow.name, raw, exc)
        policies[prow.alias] = Policy(
            name=prow.name,
            alias=prow.alias,
            rules=tuple(rules),
            default_pool=prow.default_pool.name if prow.default_pool else None,
            fallback_pool=prow.fallback_pool.name if prow.fallback_pool else None,
            spills=policy_spills(tuple(rules)),
        )
    return policies


@dataclass(slots=True)
class RoutingSource:
    """What a routing snapshot is built from, as read from the database, kept by the proxy beside it.

    In a big fleet the common change is one deployment's state (an engine became ready, degraded or
    went to sleep), many times a second across thousands of deployments. Rereading the whole fleet for
    each cost every proxy process its core (docs/proxy.md, "Config changes"); with this kept, such a
    change rereads that deployment and rebuilds the pools of its alias only (`patch_deployments`),
    whatever the fleet's size. Every other change rebuilds everything from a fresh source.
    """

    models: dict[str, ModelInfo]
    pool_rows: dict[str, list[RoutePool]]  # by alias
    pool_names: frozenset[str]
    policies: dict[str, Policy]
    rollouts: dict[str, Rollout]  # the active rollout by alias
    shadow_rows: dict[str, ShadowConfig]  # by alias
    chains: dict[tuple[int | None, str], ChainSpec]
    static: dict[str, list[Endpoint]]  # by served name
    # The fleet's ready and sleeping deployments by served name, then by deployment id.
    ready: dict[str, dict[int, Endpoint]] = field(default_factory=dict)
    asleep: dict[str, dict[int, Endpoint]] = field(default_factory=dict)
    # Where each of those deployments is (its served name), and its place in a pool (host name, port:
    # the order a full load reads them in, so a patched pool lists its endpoints as a reload would).
    where: dict[int, str] = field(default_factory=dict)
    order: dict[int, tuple[str, int]] = field(default_factory=dict)
    version_labels: dict[int, str] = field(default_factory=dict)

    def put(self, dep: DeploymentRow) -> str | None:
        """Hold `dep` as it now is (or drop it when it neither routes nor sleeps); its served name."""
        self.drop(dep.pk)
        if dep.state not in ROUTED_STATES:
            return None
        bucket = self.ready if dep.state == DeploymentState.READY else self.asleep
        bucket.setdefault(dep.served_model_name, {})[dep.pk] = _endpoint(dep)
        self.where[dep.pk] = dep.served_model_name
        self.order[dep.pk] = (dep.host_name, dep.port)
        self.version_labels[dep.version_id] = dep.version_label
        return dep.served_model_name

    def drop(self, deployment_id: int) -> str | None:
        """Forget a deployment; the served name it had, if it was held."""
        alias = self.where.pop(deployment_id, None)
        self.order.pop(deployment_id, None)
        if alias is None:
            return None
        for bucket in (self.ready, self.asleep):
            members = bucket.get(alias)
            if members is not None and members.pop(deployment_id, None) is not None and not members:
                del bucket[alias]
        return alias

    def members(self, bucket: dict[str, dict[int, Endpoint]], alias: str) -> list[Endpoint]:
        held = bucket.get(alias)
        if not held:
            return []
        return [held[pk] for pk in sorted(held, key=self.order.__getitem__)]

    def served(self) -> set[str]:
        """Every name some endpoint serves, awake or asleep."""
        return set(self.ready) | set(self.static) | set(self.asleep)


def load_routing_source() -> RoutingSource:
    """Everything a routing snapshot is built from (sync: call it in a thread)."""
    rows: dict[str, list[RoutePool]] = {}
    pool_rows = list(RoutePool.objects.select_related("model_version__model"))
    for row in pool_rows:
        rows.setdefault(row.alias, []).append(row)
    shadows = ShadowConfig.objects.select_related("alias", "candidate_version__model").filter(
        enabled=True, percent__gt=0
    )
    static: dict[str, list[Endpoint]] = {}
    for ep in _static_endpoints():
        static.setdefault(ep.served_model_name, []).append(ep)
    src = RoutingSource(
        models=_models(),
        pool_rows=rows,
        pool_names=frozenset(row.name for row in pool_rows),
        policies=_policies(),
        rollouts=_canaries(),
        shadow_rows={row.alias.name: row for row in shadows},
        chains=_chains(),
        static=static,
    )
    for dep in deployment_rows(Deployment.objects.filter(state__in=ROUTED_STATES)):
        src.put(dep)
    return src


def _alias_pools(src: RoutingSource, alias: str, ready: list[Endpoint], asleep: list[Endpoint]) -> list[Pool]:
    """The pools that route `alias`: its RoutePools, or the implicit one named after it."""
    info = src.models.get(alias)
    active = info.version_id if info else None
    # Version selection happens here, once per build: pools hold only the endpoints of the version they
    # serve (the alias's active one unless the pool names its own), so the hot path does not change.
    pools: list[Pool] = []
    for row in src.pool_rows.get(alias, []):
        version = row.model_version_id or active
        members, staged = _split_by_version(ready, version, row.role)
        pools.append(
            Pool(
                name=row.name,
                alias=row.alias,
                scorer=row.scorer,
                weights={k: float(v) for k, v in (row.scorer_weights or {}).items()},
                session_header=row.session_header.lower(),
                connect_timeout_s=row.connect_timeout_s,
                first_byte_timeout_s=row.first_byte_timeout_s,
                inter_token_timeout_s=row.inter_token_timeout_s,
                total_timeout_s=row.total_timeout_s,
                max_retries=row.max_retries,
                max_inflight_per_endpoint=row.max_inflight_per_endpoint,
                batch_max_fraction=row.batch_max_fraction,
                endpoints=members,
                version_id=version,
                pinned=row.model_version_id is not None,
                version_label=str(row.model_version)
                if row.model_version
                else (info.version_label if info else ""),
                staged=staged,
                sleeping=_split_by_version(asleep, version, row.role)[0],
                wake_timeout_s=row.wake_timeout_s,
            )
        )
    # Every alias served by some endpoint gets an implicit pool so a fresh fleet routes with no setup;
    # one whose active version has no ready endpoint too (empty), so its requests are told why.
    # An alias whose engines all sleep too, so its first request wakes one.
    if (ready or asleep) and alias not in src.pool_names:
        members, staged = _split_by_version(ready, active)
        pools.append(
            Pool(
                name=alias,
                alias=alias,
                endpoints=members,
                version_id=active,
                version_label=info.version_label if info else "",
                staged=staged,
                sleeping=_split_by_version(asleep, active)[0],
            )
        )
    # Canaries ride on the pools: the candidate's endpoints are already among each pool's staged ones.
    for pool in pools:
        pool.canary = _canary(src.rollouts.get(alias), pool)
    return pools


def _build_alias(src: RoutingSource, snap: RoutingSnapshot, alias: str) -> None:
    """(Re)build everything of `snap` that depends on `alias`'s endpoints: its pools, its counting rule,
    whether it embeds, its shadow. `snap`'s dicts must be its own (not shared with a live snapshot)."""
    for row in src.pool_rows.get(alias, []):
        snap.pools.pop(row.name, None)
    implicit = snap.pools.get(alias)
    if implicit is not None and implicit.alias == alias:
        del snap.pools[alias]
    ready = src.members(src.ready, alias) + src.static.get(alias, [])
    asleep = src.members(src.asleep, alias)
    for pool in _alias_pools(src, alias, ready, asleep):
        snap.pools[pool.name] = pool

    info = src.models.get(alias)
    serving, _ = _split_by_version(ready, info.version_id if info else None)
    if (
        serving
        and all(ep.sim_builtin_tokenizer for ep in serving)
        and (info is None or info.tokenizer_path is None)
    ):
        # No tokenizer file and only simulated engines serve it: count as they do (see ModelInfo).
        snap.models[alias] = ModelInfo(
            alias=alias,
            version_id=info.version_id if info else None,
            tokenizer_path=None,
            max_context=info.max_context if info else None,
            sim_tokens=True,
            version_label=info.version_label if info else "",
        )
    elif info is not None:
        snap.models[alias] = info
    else:
        snap.models.pop(alias, None)
    if serving and all(ep.embeddings is False for ep in serving):
        snap.no_embeddings = snap.no_embeddings | {alias}
    elif alias in snap.no_embeddings:
        snap.no_embeddings = snap.no_embeddings - {alias}
    shadow = src.shadow_rows.get(alias)
    if shadow is not None:
        snap.shadows[alias] = _shadow(shadow, ready)


def _finish(src: RoutingSource, snap: RoutingSnapshot) -> RoutingSnapshot:
    snap.aliases = tuple(sorted(src.served() | set(src.policies)))
    return snap


def build_routing_snapshot(src: RoutingSource) -> RoutingSnapshot:
    """The snapshot `src` describes, built whole."""
    snap = RoutingSnapshot(
        policies=src.policies,
        models=dict(src.models),
        version_labels=src.version_labels,
        chains=src.chains,
    )
    for alias in sorted(src.served() | set(src.pool_rows) | set(src.shadow_rows)):
        _build_alias(src, snap, alias)
    for alias in sorted(src.ready):
        for pk in sorted(src.ready[alias], key=src.order.__getitem__):
            ep = src.ready[alias][pk]
            snap.endpoints[ep.id] = ep
    for members in src.static.values():
        snap.endpoints.update((ep.id, ep) for ep in members)
    return _finish(src, snap)


def load_routing_snapshot() -> RoutingSnapshot:
    """Pools, policies, aliases and endpoints as one consistent snapshot (sync: call it in a thread)."""
    return build_routing_snapshot(load_routing_source())


def load_deployments(ids: set[int], hosts: set[str]) -> tuple[set[int], list[DeploymentRow]]:
    """The deployments with these ids or on these hosts, as they are now (sync: call it in a thread):
    the ids asked about (those on the hosts included) and the rows found. An id asked about and not
    found was deleted."""
    rows = deployment_rows(Deployment.objects.filter(models.Q(pk__in=ids) | models.Q(host__name__in=hosts)))
    return ids | {row.pk for row in rows}, rows


def patch_deployments(
    src: RoutingSource, snap: RoutingSnapshot, asked: set[int], rows: list[DeploymentRow]
) -> RoutingSnapshot:
    """A new snapshot: `snap` with the deployments `asked` about as `rows` say they now are.

    Only the aliases those deployments served or now serve are rebuilt; the rest of `snap` is shared
    with the new snapshot (it is never changed in place: a request in flight keeps reading the one it
    started with). `src` is updated to match."""
    found = {row.pk: row for row in rows}
    touched: set[str] = set()
    for pk in asked:
        old = src.drop(pk)
        if old is not None:
            touched.add(old)
        row = found.get(pk)
        if row is not None:
            new = src.put(row)
            if new is not None:
                touched.add(new)
    out = RoutingSnapshot(
        pools=dict(snap.pools),
        policies=snap.policies,
        models=dict(snap.models),
        endpoints=dict(snap.endpoints),
        no_embeddings=snap.no_embeddings,
        version_labels=src.version_labels,
        shadows=dict(snap.shadows),
        chains=snap.chains,
    )
    for pk in asked:
        out.endpoints.pop(str(pk), None)
    for alias in sorted(touched):
        _build_alias(src, out, alias)
        for ep in src.ready.get(alias, {}).values():
            out.endpoints[ep.id] = ep
    return _finish(src, out)


# ---- the shared (Redis) copy of key records --------------------------------------------------------
#
# Records live under `<prefix>apikeys:rec:<hmac digest>` (hashes only, never a raw key) and carry
# the global key generation `<prefix>apikeys:gen` they were read under (key names in
# core.redis_client). Every key/tenant/quota change bumps that generation
# (core.redis_client.publish_config_change) after its transaction commits, so a record read from
# the database before the change can neither be written back (the Lua script below
# compares generations) nor be used if it already was (readers compare the stamp).

# KEYS[1] generation, KEYS[2] record; ARGV[1] generation seen before the database read, ARGV[2] record,
# ARGV[3] time to live in ms. Writes only when no change has happened since the read began.
WRITE_BACK_LUA = """
local gen = redis.call('GET', KEYS[1]) or '0'
if gen ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"""


def _limits_dict(limits: Limits) -> dict[str, int | None]:
    return {
        "requests_per_minute": limits.requests_per_minute,
        "tokens_per_minute": limits.tokens_per_minute,
        "max_concurrent_requests": limits.max_concurrent_requests,
        "daily_token_budget": limits.daily_token_budget,
        "max_input_tokens": limits.max_input_tokens,
        "max_output_tokens": limits.max_output_tokens,
    }


def key_record(info: KeyInfo, generation: str) -> dict[str, Any]:
    """The JSON-able shared copy of `info`, stamped with the generation it was read under."""
    return {
        "gen": generation,
        "id": info.id,
        "prefix": info.prefix,
        "hashed_key": info.hashed_key,
        "tenant_id": info.tenant_id,
        "tenant_name": info.tenant_name,
        "tenant_active": info.tenant_active,
        "log_prompts": info.log_prompts,
        "scopes": sorted(info.scopes),
        "expires_at": info.expires_at,
        "revoked": info.revoked,
        "tenant_limits": _limits_dict(info.tenant_limits),
        "key_limits": _limits_dict(info.key_limits),
        "shadow_consent": info.shadow_consent,
        "slo_class": info.slo_class,
    }


def key_info_from_record(record: dict[str, Any]) -> KeyInfo:
    """The KeyInfo a shared record describes (raises KeyError/TypeError on a malformed one)."""
    return KeyInfo(
        id=int(record["id"]),
        prefix=str(record["prefix"]),
        hashed_key=str(record["hashed_key"]),
        tenant_id=int(record["tenant_id"]),
        tenant_name=str(record["tenant_name"]),
        tenant_active=bool(record["tenant_active"]),
        log_prompts=bool(record["log_prompts"]),
        scopes=frozenset(record["scopes"]),
        expires_at=record["expires_at"],
        revoked=bool(record["revoked"]),
        tenant_limits=Limits(**record["tenant_limits"]),
        key_limits=Limits(**record["key_limits"]),
        # Records written before the flag existed never consent: mirroring needs a yes, not a default.
        shadow_consent=bool(record.get("shadow_consent", False)),
        slo_class=str(record.get("slo_class") or settings.PROXY_DEFAULT_SLO_CLASS),
    )
