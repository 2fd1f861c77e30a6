"""llama.cpp for CPU nodes, through llama-cpp-python's OpenAI server: `python -m
nodes.engines.llamacpp_server` runs `llama_cpp.server` itself (same flags, same OpenAI routes) plus one
route of ours, POST /inferchain/v1/token_logprobs (distributions keyed by token id, for the evaluation
runner's exact KL: see that module).

Its settings are pydantic fields turned into `--snake_case` flags (llama_cpp/server/settings.py).
It has no /health and no /metrics. /v1/models waits on the model lock while a completion runs, so
it cannot be the liveness probe (a busy engine would look dead); FastAPI's /docs page is served by
the event loop without that lock and answers while the model is busy.

By default the server ends a streamed completion early (a bare `[DONE]`, no error) as soon as another
request waits for the model: the supervisor's /v1/models probe, or a second client, would silently cut
answers short (an evaluation run then scores truncated text). `--interrupt_requests false` makes the
other request wait instead.
"""

from __future__ import annotations

from nodes.engines.base import EngineSpec
from nodes.engines.metrics import EngineMetrics

name = "llamacpp"
health_path = "/docs"
models_path = "/v1/models"
metrics_path: str | None = None


def build_argv(spec: EngineSpec) -> list[str]:
    argv = [
        spec.python,
        "-m",
        "nodes.engines.llamacpp_server",
        "--model",
        spec.model_path,
        "--model_alias",
        spec.served_model_name,
        "--host",
        spec.bind_host,
        "--port",
        str(spec.port),
        "--n_ctx",
        str(spec.max_model_len),
        "--interrupt_requests",
        "false",
    ]
    if spec.max_num_batched_tokens is not None:
        argv += ["--n_batch", str(spec.max_num_batched_tokens)]
    return [*argv, *spec.extra_args]


def build_env(spec: EngineSpec) -> dict[str, str]:
    return {
        # CPU engine: hide any GPU so that a llama.cpp build with CUDA does not grab one by accident.
        "CUDA_VISIBLE_DEVICES": "",
        # llama_cpp.server lets $HOST and $PORT override --host/--port (uvicorn.run(host=os.getenv("HOST",
        # ...))), and process managers set PORT (honcho does): pin both to the deployment's values.
        "HOST": spec.bind_host,
        "PORT": str(spec.port),
        # Its settings are pydantic-settings fields: a flag left out is read from the environment, so the
        # key stays out of the command line (`ps`). Every route it serves but /docs and /openapi.json
        # depends on this key (llama_cpp/server/app.py `authenticate`), /tokenize and /detokenize included.
        "API_KEY": spec.api_key,
    }


def parse_metrics(text: str) -> EngineMetrics:
    return EngineMetrics()
