"""A vLLM simulator: a process that serves vLLM's HTTP API and metrics with a modelled GPU behind it.

Run it like vLLM: `python -m vllm_sim serve MODEL --port 8000 [vLLM flags] [--sim-* knobs]`.
docs/simulator.md describes the model, the profiles and their sources. Nothing here imports Django,
so the simulator starts in a fraction of a second on any machine.
"""
