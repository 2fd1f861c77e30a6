"""The HTTP side of the simulator: vLLM's OpenAI-compatible surface on aiohttp, in front of SimEngine.

One module per endpoint family; each holds a mixin of SimServer's handlers over the shared state:

- state.py: ServerState (configuration, engine cores, serving limits, counters), JSON responses and
  request-body parsing with vLLM's refusals.
- app.py: SimServer, every family together; the route table (build_app), the API-key and error
  middlewares.
- basic.py: /health, /ping, /version, /load, /metrics, /v1/models, /openapi.json, /docs, /redoc.
- tokenizer.py: /tokenize, /detokenize, /tokenizer_info.
- generation.py: /v1/chat/completions, /v1/chat/completions/batch, /v1/completions, /v1/responses,
  /invocations; the fault knobs, the data-parallel balancer and the sequences a request runs as.
- output.py: what a generation answers: JSON bodies, SSE streams, usage, logprobs.
- stubs.py: /generative_scoring, /scale_elastic_ep, /is_scaling_elastic_ep (nothing behind them).
- dev.py: /sleep, /wake_up, /is_sleeping, /reset_prefix_cache, /server_info (VLLM_SERVER_DEV_MODE=1).
- sim.py: /sim/gpu, /sim/stats, /sim/slowdown (the simulator's own).
- process.py: serve(), one `vllm serve` process from start to exit, and build_shape().
"""

from vllm_sim.server.app import GUARDED_PREFIXES, SimServer
from vllm_sim.server.basic import VERSION
from vllm_sim.server.generation import ENGINE_DEAD_MESSAGE
from vllm_sim.server.process import QUANTIZATION_METHODS, QUANTIZATION_METHODS_ORDER, build_shape, serve

__all__ = [
    "ENGINE_DEAD_MESSAGE",
    "GUARDED_PREFIXES",
    "QUANTIZATION_METHODS",
    "QUANTIZATION_METHODS_ORDER",
    "VERSION",
    "SimServer",
    "build_shape",
    "serve",
]
