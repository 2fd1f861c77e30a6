"""Make a lower-bit GGUF from a registered GGUF version with llama.cpp's quantizer, and register it.

`quantize_version()` is the registry action behind `POST /api/model-versions/{id}/quantize/` (run by the
Celery task `models_registry.quantize_version`). It calls `llama_cpp.llama_model_quantize` (llama-cpp-
python's binding of llama.cpp's `llama-quantize`) with requantizing allowed, so an already quantized file
(SmolLM2's Q4_1) can be brought down further (Q2_K); registers the output as a new version of the same
model whose lineage parent is the source (evaluations then use the source as the reference); and writes
on it how the file was made (`ModelVersion.provenance`): the tool, the llama.cpp and llama-cpp-python
versions, the source version and file sha256, the target type and every quantizer parameter.

Requantizing loses more than quantizing from full precision (llama.cpp warns about it): the point here
is a real, measurably worse candidate from a file this machine already has, not the best Q2_K.

K-quants work on rows of 256 weights; a tensor whose rows are not a multiple of that (SmolLM2's 576-wide
layers) gets llama.cpp's fallback type for the target, so a "Q2_K" SmolLM2 is Q2_K where it can be.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
from django.db import transaction

from models_registry.choices import QuantMethod, SourceKind
from models_registry.hashing import hash_files, list_files, local_host_name
from models_registry.models import ModelVersion, QuantizationConfig
from models_registry.services import register_version


@dataclass(frozen=True)
class Target:
    """One llama.cpp output type: its `llama_ftype` number, the registry's method and nominal bits, and
    the tensor type (ggml's) most of its weights are meant to get."""

    ftype: int
    method: str
    bits: int
    tensor_type: str


# llama.cpp's `enum llama_ftype` (llama.h; llama_cpp.LLAMA_FTYPE_MOSTLY_*), by llama-quantize's names.
TARGETS: dict[str, Target] = {
    "Q2_K": Target(10, QuantMethod.GGUF_Q2_K, 2, "Q2_K"),
    "Q3_K_S": Target(11, QuantMethod.GGUF_Q3_K, 3, "Q3_K"),
    "Q3_K_M": Target(12, QuantMethod.GGUF_Q3_K, 3, "Q3_K"),
    "Q4_0": Target(2, QuantMethod.GGUF_Q4_0, 4, "Q4_0"),
    "Q4_1": Target(3, QuantMethod.GGUF_Q4_1, 4, "Q4_1"),
    "Q4_K_S": Target(14, QuantMethod.GGUF_Q4_K, 4, "Q4_K"),
    "Q4_K_M": Target(15, QuantMethod.GGUF_Q4_K, 4, "Q4_K"),
    "Q5_0": Target(8, QuantMethod.GGUF_Q5_0, 5, "Q5_0"),
    "Q5_1": Target(9, QuantMethod.GGUF_Q5_1, 5, "Q5_1"),
    "Q5_K_M": Target(17, QuantMethod.GGUF_Q5_K, 5, "Q5_K"),
    "Q6_K": Target(18, QuantMethod.GGUF_Q6_K, 6, "Q6_K"),
    "Q8_0": Target(7, QuantMethod.GGUF_Q8_0, 8, "Q8_0"),
}
# Below this share of the weights in the requested tensor type, the file is not what its name says:
# llama.cpp's own mixes keep a few tensors higher (output, attn_v, ffn_down in the _M mixes), which
# leaves most weights in the requested type; a fallback for rows K-quants cannot take leaves few.
FALLBACK_SHARE = 0.5
TOOL = "llama_cpp.llama_model_quantize"


class QuantizeError(ValueError):
    """The quantize action refused or failed; `field` names the request field it is about."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def default_revision(source: ModelVersion, target_type: str) -> str:
    """`q4_1` quantized to Q2_K becomes `q4_1-q2_k`."""
    return f"{source.revision}-{target_type.lower()}"


def output_path(source: ModelVersion, target_type: str) -> Path:
    """Beside the source file (so under the same model root): `<name>.gguf` -> `<name>-<TARGET>.gguf`."""
    src = Path(source.source_path)
    return src.with_name(f"{src.stem}-{target_type}.gguf")


def check_request(source: ModelVersion, target_type: str, revision: str) -> None:
    """Everything that can be refused before any work, each with the field it concerns."""
    if target_type not in TARGETS:
        raise QuantizeError(
            "target_type", f"Unknown target type {target_type!r}; choose one of {', '.join(TARGETS)}."
        )
    if source.source_kind != SourceKind.GGUF:
        raise QuantizeError("source", f"{source} is a {source.source_kind}, not a GGUF file; only GGUF is.")
    if not Path(source.source_path).is_file():
        raise QuantizeError("source", f"{source}: its file {source.source_path} is missing on this host.")
    if not revision.strip():
        raise QuantizeError("revision", "revision must not be empty.")
    if ModelVersion.objects.filter(model_id=source.model_id, revision=revision.strip()).exists():
        raise QuantizeError("revision", f"{source.model.name} already has a version {revision.strip()!r}.")
    if output_path(source, target_type).exists():
        raise QuantizeError(
            "target_type", f"{output_path(source, target_type)} already exists; remove it or register it."
        )
    try:
        llama_cpp_module()
    except ImportError:
        raise QuantizeError(
            "non_field_errors", "llama-cpp-python is not installed on this host (make llama)."
        ) from None


def llama_cpp_module() -> Any:
    # Imported on use: llama-cpp-python is an optional extra (make llama), and loading it costs a second.
    import llama_cpp

    return llama_cpp


def source_sha256(source: ModelVersion, host: str) -> str:
    """The source file's sha256 now (hash cache: one stat when unchanged), checked against its manifest."""
    listing = list_files(Path(source.source_path))
    tree = hash_files(listing.files, host_name=host)
    if listing.errors or tree.unreadable or len(tree.files) != 1:
        raise QuantizeError("source", f"{source}: its file {source.source_path} cannot be read.")
    sha = tree.files[0].sha256
    pinned = list(source.files.values_list("sha256", flat=True))
    if pinned != [sha]:
        raise QuantizeError(
            "source", f"{source}: the file no longer matches its manifest (sha256 {sha[:12]}…); re-verify it."
        )
    return sha


def tensor_report(path: Path, target_type: str | None = None) -> dict[str, Any]:
    """What a GGUF file holds, read from its tensors (gguf.GGUFReader): weights and bytes per tensor
    type, bits per weight over the whole file, and, for a requested `target_type`, the share of the
    weights in its tensor type and a `warning` when llama.cpp fell back to other types for most of them.
    """
    reader = gguf.GGUFReader(str(path), "r")
    by_type: dict[str, dict[str, int]] = {}
    for tensor in reader.tensors:
        row = by_type.setdefault(tensor.tensor_type.name, {"tensors": 0, "weights": 0, "bytes": 0})
        row["tensors"] += 1
        row["weights"] += int(tensor.n_elements)
        row["bytes"] += int(tensor.n_bytes)
    weights = sum(r["weights"] for r in by_type.values()) or 1
    size = sum(r["bytes"] for r in by_type.values())
    types = [
        {
            "type": name,
            **row,
            "share": round(row["weights"] / weights, 4),
            "bits_per_weight": round(row["bytes"] * 8 / max(1, row["weights"]), 3),
        }
        for name, row in sorted(by_type.items(), key=lambda item: -item[1]["weights"])
    ]
    report: dict[str, Any] = {
        "weights": weights,
        "bytes": size,
        "bits_per_weight": round(size * 8 / weights, 3),
        "tensor_types": types,
        "requested": None,
        "warning": None,
    }
    target = TARGETS.get(target_type or "")
    if target is not None:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[target.tensor_type]]
        nominal = round(type_size * 8 / block, 3)
        share = by_type.get(target.tensor_type, {}).get("weights", 0) / weights
        report["requested"] = {
            "type": target_type,
            "tensor_type": target.tensor_type,
            "nominal_bits_per_weight": nominal,
            "share": round(share, 4),
        }
        if share < FALLBACK_SHARE:
            others = ", ".join(
                f"{t['type']} {t['share']:.0%}" for t in types if t["type"] != target.tensor_type
            )
            kind = target.tensor_type
            report["warning"] = (
                f"Only {share:.0%} of the weights are {kind}; llama.cpp used other types for the rest "
                f"({others}), e.g. where K-quant rows are not a multiple of 256 weights. The file is "
                f"{report['bits_per_weight']} bits per weight, against {nominal} for {kind}."
            )
    return report


def quantize_version(
    source_id: int,
    target_type: str,
    *,
    revision: str | None = None,
    nthread: int = 0,
    actor: Any = None,
    host_name: str | None = None,
) -> ModelVersion:
    """Quantize a GGUF version to `target_type` and register the result with the source as its parent.

    All or nothing: the file is written beside the source under a temporary name and moved into place
    only after llama.cpp succeeds; a failed registration removes it again.
    """
    source = ModelVersion.objects.select_related("model").get(pk=source_id)
    revision = (revision or default_revision(source, target_type)).strip()
    check_request(source, target_type, revision)
    llama_cpp = llama_cpp_module()
    host = host_name or local_host_name()
    target = TARGETS[target_type]
    sha = source_sha256(source, host)
    out = output_path(source, target_type)
    partial = out.with_name(out.name + ".partial")

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = target.ftype
    params.nthread = nthread
    params.allow_requantize = True
    # Every plain field of llama_model_quantize_params as passed (the pointers are all null: no
    # importance matrix, no overrides).
    recorded = {
        name: getattr(params, name) for name, _ in params._fields_ if isinstance(getattr(params, name), int)
    }
    started = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(source.source_path).encode(), str(partial).encode(), params)
    seconds = time.perf_counter() - started
    if rc != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise QuantizeError("non_field_errors", f"llama.cpp's quantizer failed (return code {rc}).")
    os.replace(partial, out)

    quant, _ = QuantizationConfig.objects.get_or_create(
        name=f"gguf-{target_type.lower()}",
        defaults={"method": target.method, "bits": target.bits, "description": f"llama.cpp {target_type}"},
    )
    # The lineage is one level deep (a parent is full precision): a source that is itself quantized
    # from something names that root as the parent, and the provenance says which file it came from.
    parent = source.parent if source.parent_id is not None else source
    provenance = {
        "tool": TOOL,
        "llama_cpp_python": str(llama_cpp.__version__),
        "llama_cpp": (llama_cpp.llama_version() or b"").decode(errors="replace"),
        "source_version": source.pk,
        "source_file": Path(source.source_path).name,
        "source_sha256": sha,
        "target_type": target_type,
        "params": recorded,
        "seconds": round(seconds, 3),
        "host": host,
        # What llama.cpp actually wrote, which for a small model can be far from the name (see above).
        "produced": tensor_report(out, target_type),
    }
    try:
        with transaction.atomic():
            version = register_version(
                model=source.model,
                revision=revision,
                source_path=str(out),
                quantization=quant,
                parent=parent,
                actor=actor,
                host_name=host,
            )
            version.provenance = provenance
            version.save(update_fields=["provenance", "updated_at"])
    except Exception:
        out.unlink(missing_ok=True)
        raise
    return version
