"""Placement help for the deploy wizard: free memory per GPU, a placement that fits, the verdict with its
whole arithmetic, and, when nothing fits, what would.

Why here and not in the wizard: the answer must agree with what create will accept, so it is built from
the same pieces preflight uses (`gpu_reservations` and `held_fraction` for what other deployments hold,
the registry's `fit_check` for weights, overhead and KV cache) and never re-derives them. A GPU's free
memory is what those reservations leave, not what nvidia-smi shows at this instant: vLLM claims its
whole gpu_memory_utilization share at start-up, so a reservation is taken whether or not it is filled yet.

One host at a time (tensor parallel over that host's GPUs); a deployment across hosts is placed by hand
(docs/deploying.md, "One model across hosts").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from models_registry.choices import SourceKind
from models_registry.estimate import (
    DEFAULT_OVERHEAD_BYTES,
    GIB,
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    ArchitectureError,
    FitResult,
    Step,
)
from models_registry.models import ModelVersion, QuantizationConfig
from models_registry.services import fit_check
from nodes.choices import Engine, HostState
from nodes.lifecycle import host_is_reachable
from nodes.models import Host
from nodes.preflight import reservations

# A proposal may lower gpu_memory_utilization to share a GPU, but not below this: an engine squeezed into
# a sliver of a GPU is not a placement anyone wants proposed.
MIN_PROPOSED_UTILIZATION = 0.10
# Alternatives of one kind listed at most (the wizard shows each with a button).
MAX_ALTERNATIVES = 3
# Leeway for float shares, as preflight allows (taken + wanted <= 1 + 1e-9).
EPSILON = 1e-9


class PlacementError(ValueError):
    """Input the placement cannot be computed for; `field` names the request field to fix."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class EngineSettings:
    """The engine settings that decide memory: what the wizard has filled in (None: vLLM's default)."""

    max_model_len: int
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int | None = None  # None: as many GPUs as it takes (1, 2, 4, 8)

    @property
    def wanted_utilization(self) -> float:
        return (
            VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
            if self.gpu_memory_utilization is None
            else self.gpu_memory_utilization
        )


@dataclass
class GpuFree:
    """One GPU's memory as the fit check counts it: its total, the shares others reserve, what is left."""

    index: int
    name: str
    memory_total_bytes: int
    reserved_fraction: float
    holders: list[tuple[str, float]]

    @property
    def free_fraction(self) -> float:
        return max(0.0, 1.0 - self.reserved_fraction)

    @property
    def free_bytes(self) -> int:
        return int(self.memory_total_bytes * self.free_fraction)

    @property
    def reserved_bytes(self) -> int:
        return self.memory_total_bytes - self.free_bytes


@dataclass
class HostFree:
    """A host, whether new deployments may go there (and why not), and its GPUs' free memory."""

    host: Host
    usable: bool
    note: str
    gpus: list[GpuFree]


@dataclass
class Placement:
    """Where to run: a host, its GPUs, and the gpu_memory_utilization to run with (None: unchanged)."""

    host: Host
    gpu_indices: list[int]
    gpu_memory_utilization: float | None
    lowered_utilization: bool
    fit: FitResult


@dataclass
class GpuLine:
    """One GPU of the verdict: its total and free memory against this engine's budget on it."""

    gpu: GpuFree
    budget_bytes: int
    ok: bool


@dataclass
class Verdict:
    """Does it fit on these GPUs, and the arithmetic that says so."""

    fits: bool
    reason: str
    host: Host
    gpu_indices: list[int]
    gpu_memory_utilization: float
    lines: list[Step]
    gpus: list[GpuLine]
    fit: FitResult
    host_usable: bool = True


@dataclass
class Alternative:
    """A change that would fit, with the values the wizard sets when it is applied."""

    kind: str  # context, utilization, version, host
    label: str
    reason: str
    changes: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlacementAnswer:
    engine_uses_gpus: bool
    note: str
    hosts: list[HostFree]
    proposed: Placement | None = None
    verdict: Verdict | None = None
    alternatives: list[Alternative] = field(default_factory=list)


# --------------------------------------------------------------------------- free memory


def host_free(host: Host, held: Mapping[tuple[int, int], list[tuple[str, float]]]) -> HostFree:
    """The host's GPUs with the memory others reserve on each (`held`: preflight's `reservations`)."""
    gpus = sorted(host.gpus.all(), key=lambda g: g.index)
    rows = [
        GpuFree(
            index=g.index,
            name=g.name,
            memory_total_bytes=g.memory_total_bytes,
            reserved_fraction=sum(share for _, share in held.get((host.pk, g.index), [])),
            holders=list(held.get((host.pk, g.index), [])),
        )
        for g in gpus
    ]
    if not host_is_reachable(host):
        usable, note = False, f"{host.name} is unreachable (no fresh heartbeat from its agent)."
    elif host.state == HostState.DRAINING:
        usable, note = False, f"{host.name} is draining and accepts no new deployments."
    elif not rows:
        usable, note = False, f"{host.name} reports no GPUs."
    else:
        usable, note = True, ""
    return HostFree(host=host, usable=usable, note=note, gpus=rows)


def fleet_free() -> list[HostFree]:
    """host_free of every host, by name, in a fixed number of queries whatever the fleet's size."""
    hosts = list(Host.objects.prefetch_related("gpus").order_by("name"))
    totals = {(h.pk, g.index): g.memory_total_bytes for h in hosts for g in h.gpus.all()}
    held = reservations(None, None, totals)
    return [host_free(h, held) for h in hosts]


# --------------------------------------------------------------------------- the fit on some GPUs


def _fit(
    version: ModelVersion,
    quantization: QuantizationConfig | None,
    gpus: list[GpuFree],
    settings: EngineSettings,
    utilization: float | None,
) -> FitResult:
    """The registry's fit check on these GPUs, tensor parallel over all of them (as preflight runs it)."""
    return fit_check(
        version,
        quantization,
        sum(g.memory_total_bytes for g in gpus),
        utilization,
        settings.max_model_len,
        settings.max_num_seqs,
        other_reserved_bytes=0,
        tensor_parallel_size=len(gpus),
        gpu_name=gpus[0].name,
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )


def _tp_sizes(version: ModelVersion, settings: EngineSettings, most: int) -> list[int]:
    """The tensor-parallel sizes to try, fewest GPUs first: vLLM splits attention heads evenly over them."""
    if settings.tensor_parallel_size is not None:
        return [settings.tensor_parallel_size]
    heads = int((version.architecture or {}).get("num_attention_heads") or 1)
    return [tp for tp in (1, 2, 4, 8) if tp <= most and heads % tp == 0]


def _place_on_host(
    version: ModelVersion,
    quantization: QuantizationConfig | None,
    settings: EngineSettings,
    free: HostFree,
    tp: int,
) -> Placement | None:
    """The `tp` GPUs of the host with the most free memory, if the engine fits on them.

    When the wanted utilization does not fit beside what others reserve, the share left is tried instead
    (rounded down to a hundredth, never under MIN_PROPOSED_UTILIZATION): vLLM then sizes its budget to it.
    """
    if not free.usable or len(free.gpus) < tp:
        return None
    chosen = sorted(free.gpus, key=lambda g: (-g.free_fraction, g.index))[:tp]
    room = min(g.free_fraction for g in chosen)
    utilization = settings.gpu_memory_utilization
    lowered = False
    if settings.wanted_utilization > room + EPSILON:
        utilization = math.floor(room * 100 + EPSILON) / 100
        lowered = True
        if utilization < MIN_PROPOSED_UTILIZATION:
            return None
    fit = _fit(version, quantization, chosen, settings, utilization)
    if not fit.fits:
        return None
    return Placement(
        host=free.host,
        gpu_indices=sorted(g.index for g in chosen),
        gpu_memory_utilization=utilization,
        lowered_utilization=lowered,
        fit=fit,
    )


def propose(
    version: ModelVersion,
    quantization: QuantizationConfig | None,
    settings: EngineSettings,
    hosts: list[HostFree],
) -> Placement | None:
    """A placement that fits: the fewest GPUs, then a whole share over a lowered one, then host order."""
    most = max((len(h.gpus) for h in hosts if h.usable), default=0)
    for tp in _tp_sizes(version, settings, most):
        found = [
            p for h in hosts if (p := _place_on_host(version, quantization, settings, h, tp)) is not None
        ]
        if found:
            return min(found, key=lambda p: p.lowered_utilization)
    return None


def verdict(
    version: ModelVersion,
    quantization: QuantizationConfig | None,
    settings: EngineSettings,
    free: HostFree,
    gpu_indices: list[int],
) -> Verdict:
    """Whether the engine fits on these GPUs of this host, with every number behind the answer."""
    by_index = {g.index: g for g in free.gpus}
    missing = [i for i in gpu_indices if i not in by_index]
    if missing:
        raise PlacementError(
            "gpu_indices",
            f"{free.host.name} has no GPU {', '.join(map(str, missing))} (its agent reports "
            f"{sorted(by_index) or 'none'}).",
        )
    if len(set(gpu_indices)) != len(gpu_indices):
        raise PlacementError("gpu_indices", "A GPU is listed twice.")
    gpus = [by_index[i] for i in gpu_indices]
    fit = _fit(version, quantization, gpus, settings, settings.gpu_memory_utilization)
    wanted = settings.wanted_utilization
    rows = [
        GpuLine(
            gpu=g, budget_bytes=int(g.memory_total_bytes * wanted), ok=wanted <= g.free_fraction + EPSILON
        )
        for g in gpus
    ]
    taken = [row for row in rows if not row.ok]
    if taken:
        first = taken[0].gpu
        names = ", ".join(f"'{name}' ({share:.0%})" for name, share in first.holders)
        reason = (
            f"GPU {first.index} on {free.host.name} has {_gib(first.free_bytes)} free ({names} reserve "
            f"{first.reserved_fraction:.0%} of {_gib(first.memory_total_bytes)}); this engine's budget "
            f"there is {_gib(taken[0].budget_bytes)} (gpu_memory_utilization {wanted:g})."
        )
    else:
        reason = fit.reason
    if not free.usable:
        # The memory may add up, but create refuses the host (preflight's host check): say so first.
        reason = f"{free.note} {reason}"
    return Verdict(
        fits=fit.fits and not taken and free.usable,
        reason=reason,
        host=free.host,
        gpu_indices=list(gpu_indices),
        gpu_memory_utilization=wanted,
        lines=need_lines(fit, settings, len(gpus)),
        gpus=rows,
        fit=fit,
        host_usable=free.usable,
    )


def need_lines(fit: FitResult, settings: EngineSettings, world: int) -> list[Step]:
    """What the engine needs: weights, the KV cache of one full-length sequence, the runtime overhead,
    in all and per GPU, against the budget vLLM takes. The fit check's own steps follow in `fit.steps`."""
    formulas = {s.label: s.formula for s in fit.steps}
    kv_sequence = fit.kv_bytes_per_token * settings.max_model_len
    overhead = DEFAULT_OVERHEAD_BYTES * world
    needed = fit.weight_bytes + kv_sequence + overhead
    per_gpu = (fit.weight_bytes + kv_sequence) // world + DEFAULT_OVERHEAD_BYTES
    gpus = f"{world} GPU" + ("s" if world > 1 else "")
    return [
        Step("weights", formulas.get("weights", ""), fit.weight_bytes),
        Step("KV cache per token", formulas.get("KV cache per token", ""), fit.kv_bytes_per_token),
        Step(
            "context (max_model_len)", "tokens of one full-length sequence", settings.max_model_len, "tokens"
        ),
        Step(
            "KV cache of one full-length sequence",
            f"{fit.kv_bytes_per_token:,} B x {settings.max_model_len:,} tokens",
            kv_sequence,
        ),
        Step(
            "runtime overhead",
            f"{DEFAULT_OVERHEAD_BYTES:,} B x {gpus} (CUDA context, activations, CUDA graphs; assumed)",
            overhead,
        ),
        Step("needed in all", f"{fit.weight_bytes:,} + {kv_sequence:,} + {overhead:,}", needed),
        Step(
            "needed per GPU",
            f"({fit.weight_bytes:,} + {kv_sequence:,}) / {world} + {DEFAULT_OVERHEAD_BYTES:,}",
            per_gpu,
        ),
        Step(
            "engine budget",
            f"{formulas.get('engine budget', 'GPU memory x utilization')}, over {gpus}",
            fit.budget_bytes,
        ),
        Step("budget left after the need", f"{fit.budget_bytes:,} - {needed:,}", fit.budget_bytes - needed),
    ]


# --------------------------------------------------------------------------- what would fit


def lineage(version: ModelVersion) -> list[ModelVersion]:
    """The version's full-precision parent and every version quantized from it, this one left out."""
    root = version.parent or version
    family = [root, *root.quantized_children.select_related("model", "quantization").order_by("pk")]
    return [v for v in family if v.pk != version.pk]


def _suits(version: ModelVersion, engine: str) -> bool:
    """vLLM serves directories, llama.cpp GGUF files (preflight refuses the other way round)."""
    return (version.source_kind == SourceKind.GGUF) == (engine == Engine.LLAMACPP)


def alternatives(
    version: ModelVersion,
    quantization: QuantizationConfig | None,
    settings: EngineSettings,
    engine: str,
    scope: list[HostFree],
    fleet: list[HostFree],
    current: Verdict | None,
) -> list[Alternative]:
    """What would fit when the current choice does not: a smaller context or a lowered utilization on
    the same GPUs, a quantized sibling from the registry's lineage, another host."""
    found: list[Alternative] = []
    if current is not None:
        found += _same_gpus(version, quantization, settings, current)
    versions: list[tuple[int, Alternative]] = []
    for sibling in lineage(version):
        if not _suits(sibling, engine):
            continue
        try:
            placed = propose(sibling, None, settings, scope)
        except ArchitectureError:
            continue
        if placed is not None:
            versions.append(
                (
                    placed.fit.weight_bytes,
                    Alternative(
                        kind="version",
                        label=f"Switch to {sibling} ({placed.fit.weight_bytes / GIB:.1f} GiB of weights)",
                        reason=f"{sibling} fits on {_where(placed)}: {placed.fit.reason}",
                        changes={
                            "model_version": sibling.pk,
                            "quantization": None,
                            **_placement_changes(placed),
                        },
                    ),
                )
            )
    # Least quantized first: the closest to the version asked for.
    versions.sort(key=lambda pair: -pair[0])
    found += [alt for _, alt in versions[:MAX_ALTERNATIVES]]
    here = {h.host.pk for h in scope} if current is None else {current.host.pk}
    hosts = 0
    for other in fleet:
        if other.host.pk in here or hosts >= MAX_ALTERNATIVES:
            continue
        placed = propose(version, quantization, settings, [other])
        if placed is not None:
            hosts += 1
            found.append(
                Alternative(
                    kind="host",
                    label=f"Deploy on {other.host.name} (GPU {', '.join(map(str, placed.gpu_indices))})",
                    reason=f"Fits on {_where(placed)}: {placed.fit.reason}",
                    changes=_placement_changes(placed),
                )
            )
    return found


def _same_gpus(
    version: ModelVersion, quantization: QuantizationConfig | None, settings: EngineSettings, current: Verdict
) -> list[Alternative]:
    """On the GPUs of the verdict: the share others leave when they hold part of them, else (or at that
    share) the largest context the budget holds. Nothing on a host that takes no new deployments."""
    if not current.host_usable:
        return []
    gpus = [row.gpu for row in current.gpus]
    room = min(g.free_fraction for g in gpus)
    utilization = settings.gpu_memory_utilization
    out: list[Alternative] = []
    if any(not row.ok for row in current.gpus):
        # Others hold part of these GPUs: the share they leave, if the engine fits in it.
        lowered = math.floor(room * 100 + EPSILON) / 100
        if lowered < MIN_PROPOSED_UTILIZATION:
            return out
        fit = _fit(version, quantization, gpus, settings, lowered)
        if fit.fits:
            out.append(
                Alternative(
                    kind="utilization",
                    label=f"Set gpu_memory_utilization to {lowered:g}",
                    reason=f"The share the other deployments leave on GPU "
                    f"{', '.join(str(g.index) for g in gpus)}: {fit.reason}",
                    changes={"gpu_memory_utilization": lowered},
                )
            )
            return out
        utilization = lowered
        fit_here = fit
    else:
        fit_here = current.fit
    # A smaller context: every KV token the budget holds, up to the model's maximum.
    largest = fit_here.max_context_that_fits
    if 0 < largest < settings.max_model_len:
        changes: dict[str, Any] = {"max_model_len": largest}
        if utilization != settings.gpu_memory_utilization:
            changes["gpu_memory_utilization"] = utilization
        out.append(
            Alternative(
                kind="context",
                label=f"Set the context (max_model_len) to {largest:,} tokens",
                reason=f"The largest context these GPUs hold: {fit_here.kv_tokens_available:,} KV tokens"
                + (
                    f", the model's maximum is {version.max_context:,}"
                    if version.max_context is not None and largest == version.max_context
                    else ""
                )
                + ".",
                changes=changes,
            )
        )
    return out


def _placement_changes(placed: Placement) -> dict[str, Any]:
    changes: dict[str, Any] = {"host": placed.host.pk, "gpu_indices": placed.gpu_indices}
    if placed.lowered_utilization:
        changes["gpu_memory_utilization"] = placed.gpu_memory_utilization
    return changes


def _where(placed: Placement) -> str:
    gpus = ", ".join(map(str, placed.gpu_indices))
    share = (
        f" at gpu_memory_utilization {placed.gpu_memory_utilization:g}" if placed.lowered_utilization else ""
    )
    return f"{placed.host.name} GPU {gpus}{share}"


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


# --------------------------------------------------------------------------- the whole answer


def placement_help(
    *,
    version: ModelVersion | None,
    quantization: QuantizationConfig | None,
    engine: str,
    host: Host | None,
    gpu_indices: list[int],
    settings: EngineSettings,
) -> PlacementAnswer:
    """Everything the deploy wizard shows about where an engine goes (see the module docstring).

    `host` None: every host is a candidate. `gpu_indices` empty: the verdict is about the proposed
    placement (or, when nothing fits, about the best GPUs there are). Raises PlacementError for input
    that cannot be computed (GPUs the host lacks, a version with no architecture).
    """
    fleet = fleet_free()
    scope = [h for h in fleet if host is None or h.host.pk == host.pk]
    if engine == Engine.LLAMACPP:
        return PlacementAnswer(
            engine_uses_gpus=False,
            note="llama.cpp runs on the host's CPU: it takes no GPUs, so there is no GPU placement to make.",
            hosts=fleet,
        )
    if version is None:
        return PlacementAnswer(
            engine_uses_gpus=True, note="Choose a model version to see where it fits.", hosts=fleet
        )
    effective = quantization or version.quantization
    try:
        proposed = propose(version, effective, settings, scope)
        current: Verdict | None = None
        if gpu_indices and len(scope) == 1:
            current = verdict(version, effective, settings, scope[0], gpu_indices)
        elif proposed is not None:
            current = verdict(
                version,
                effective,
                replace(settings, gpu_memory_utilization=proposed.gpu_memory_utilization),
                next(h for h in scope if h.host.pk == proposed.host.pk),
                proposed.gpu_indices,
            )
        else:
            current = _closest(version, effective, settings, scope)
        found = (
            []
            if current is not None and current.fits
            else alternatives(version, effective, settings, engine, scope, fleet, current)
        )
    except ArchitectureError as exc:
        raise PlacementError("model_version", f"The fit check could not run: {exc}") from None
    note = "" if proposed is not None else _nothing_fits(scope, host)
    return PlacementAnswer(
        engine_uses_gpus=True, note=note, hosts=fleet, proposed=proposed, verdict=current, alternatives=found
    )


def _closest(
    version: ModelVersion,
    quantization: QuantizationConfig | None,
    settings: EngineSettings,
    scope: list[HostFree],
) -> Verdict | None:
    """When nothing fits and no GPUs were picked: the verdict on the most free memory there is (at the
    requested tensor-parallel size, else one GPU), so the arithmetic shows by how much it misses."""
    usable = [h for h in scope if h.usable] or [h for h in scope if h.gpus]
    tp = settings.tensor_parallel_size or 1
    candidates = [h for h in usable if len(h.gpus) >= tp]
    if not candidates:
        return None
    best = max(candidates, key=lambda h: sum(sorted((g.free_bytes for g in h.gpus), reverse=True)[:tp]))
    chosen = sorted(best.gpus, key=lambda g: (-g.free_fraction, g.index))[:tp]
    return verdict(version, quantization, settings, best, sorted(g.index for g in chosen))


def _nothing_fits(scope: list[HostFree], host: Host | None) -> str:
    where = host.name if host is not None else "any host"
    unusable = [h.note for h in scope if not h.usable]
    return f"Nothing fits on {where} with these settings." + (" " + " ".join(unusable) if unusable else "")
