"""Check the agent's NVML reader and the simulator's time model against a real NVIDIA GPU.

Run on a host with an NVIDIA GPU, PyTorch and nvidia-ml-py (not a project dependency: GPU hosts have
them, this machine does not):

    python benchmarks/gpu_reality.py --out gpu_reality.json

It does two things and prints both:

1. The agent's `GpuSource` (nodes/agent/gpus.py) on real NVML: inventory, driver/CUDA versions, and
   samples at 1 Hz idle and under a matmul load, so the reader is seen working against a driver and not
   only against the simulated GPUs of this repository's tests.
2. The roofline at the heart of the simulator's step time (`vllm_sim/profiles.py:step_time_s`): a
   Llama-3.1-8B-shaped forward pass (the same linear layers, random bf16 weights; no attention, norms or
   activations, so the context term is zero) timed for decode batches and prefill chunks, next to what
   the model predicts for this GPU from its datasheet figures and the H100 profile's efficiency factors.
   Timed with CUDA events, median of repeats, both as eager PyTorch (one launch per layer, the CPU
   overhead the model's step_overhead_s stands for) and replayed from a CUDA graph (as vLLM runs decode).

Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm_sim.profiles import (
    GIB,
    MIB,
    PROFILES,
    GPUSpec,
    derive_engine_shape,
    step_time_s,
)

# Datasheet figures of the H200 SXM (NVIDIA H200 Tensor Core GPU datasheet): 141 GB HBM3e at 4.8 TB/s,
# 989 TFLOPS dense bf16 (1,979 with sparsity), up to 700 W. Memory as NVML reports it comes from NVML.
H200_BANDWIDTH, H200_DENSE_FLOPS, H200_POWER_WATTS = 4.8e12, 989e12, 700.0

DECODE_BATCHES = (1, 8, 32, 128, 256, 512)
PREFILL_CHUNKS = (512, 2048, 8192)


def nvml_check(load: Any) -> dict[str, Any]:
    from nodes.agent.gpus import GpuSource

    src = GpuSource("device-check")
    out: dict[str, Any] = {"nvml_available": src.nvml_available, "nvml_error": src.nvml_error}
    if not src.nvml_available:
        return out
    out["inventory"] = src.inventory()
    out["versions"] = src.versions()
    idle = []
    for _ in range(3):
        idle.append(src.sample()[0])
        time.sleep(1.0)
    out["idle_samples"] = idle
    busy: list[dict[str, Any]] = []
    stop = threading.Event()
    worker = threading.Thread(target=load, args=(stop,), daemon=True)
    worker.start()
    time.sleep(1.0)
    for _ in range(4):
        t0 = time.perf_counter()
        busy.append(src.sample()[0])
        busy[-1]["read_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        time.sleep(1.0)
    stop.set()
    worker.join()
    out["busy_samples"] = busy
    return out


def llama8b_layers(torch: Any, device: str) -> tuple[list[Any], Any]:
    """Weights shaped as Llama-3.1-8B's linear layers: per layer qkv, o, gate_up, down; plus lm_head."""
    h, inter, kv, layers, vocab = 4096, 14336, 1024, 32, 128256
    shapes = [(h + 2 * kv, h), (h, h), (2 * inter, h), (h, inter)]
    gen = torch.Generator(device=device).manual_seed(0)
    weights = []
    for _ in range(layers):
        for out_f, in_f in shapes:
            w = torch.randn(out_f, in_f, device=device, dtype=torch.bfloat16, generator=gen)
            weights.append(w * 0.02)
    lm_head = torch.randn(vocab, h, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
    return weights, lm_head


def forward(torch: Any, weights: list[Any], lm_head: Any, x: Any, last_rows: int) -> Any:
    # Residual stream of width 4096: qkv/o and gate_up/down read it and write back into it.
    for i in range(0, len(weights), 4):
        qkv, o, gate_up, down = weights[i : i + 4]
        a = torch.nn.functional.linear(x, qkv)[:, : x.shape[1]]
        x = x + torch.nn.functional.linear(a, o)
        g = torch.nn.functional.linear(x, gate_up)[:, : down.shape[1]]
        x = x + torch.nn.functional.linear(g, down)
    return torch.nn.functional.linear(x[-last_rows:], lm_head)


def time_ms(torch: Any, fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def roofline_check(torch: Any, gpu_name: str, memory_bytes: int) -> dict[str, Any]:
    device = "cuda"
    weights, lm_head = llama8b_layers(torch, device)
    weight_bytes = sum(w.numel() for w in weights) * 2 + lm_head.numel() * 2
    base = PROFILES["h100-llama3-8b-fp16"]
    gpu = GPUSpec(
        name=gpu_name,
        memory_bytes=memory_bytes,
        mem_bandwidth=H200_BANDWIDTH,
        dense_flops=H200_DENSE_FLOPS,
        power_max_watts=H200_POWER_WATTS,
        power_idle_watts=70.0,
    )
    # The model's weight bytes include the embedding table, which a step gathers rows of, not streams.
    profile = replace(base, gpu=gpu, model=replace(base.model, weight_bytes=weight_bytes))
    shape = derive_engine_shape(profile)
    cases = [("decode", b, b) for b in DECODE_BATCHES] + [("prefill", n, 1) for n in PREFILL_CHUNKS]
    rows = []
    for kind, tokens, seqs in cases:
        x = torch.randn(tokens, 4096, device=device, dtype=torch.bfloat16)

        def run(x: Any = x, seqs: int = seqs) -> Any:
            return forward(torch, weights, lm_head, x, seqs)

        for _ in range(3):
            run()
        torch.cuda.synchronize()
        eager = time_ms(torch, run, 15)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            run()
        graphed = time_ms(torch, graph.replay, 15)
        modelled = step_time_s(shape, num_tokens=tokens, num_seqs=seqs, context_tokens=0, attention_pairs=0)
        core = modelled - profile.step_overhead_s - seqs * profile.per_seq_overhead_s
        rows.append(
            {
                "kind": kind,
                "tokens": tokens,
                "seqs": seqs,
                "measured_eager_ms": round(eager, 3),
                "measured_graph_ms": round(graphed, 3),
                "model_roofline_ms": round(core * 1000, 3),
                "model_step_ms": round(modelled * 1000, 3),
                "graph_vs_roofline": round(graphed / (core * 1000), 3),
                "achieved_bandwidth_tb_s": round(weight_bytes / (graphed / 1000) / 1e12, 3),
                "achieved_tflops": round(2 * (weight_bytes / 2) * tokens / (graphed / 1000) / 1e12, 1),
            }
        )
        del graph
    return {
        "weight_bytes": weight_bytes,
        "assumed": {
            "mem_bandwidth": gpu.mem_bandwidth,
            "dense_flops": gpu.dense_flops,
            "bandwidth_efficiency": profile.bandwidth_efficiency,
            "mfu": profile.mfu,
        },
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_reality: PyTorch is not installed here; run this on a GPU host.")
        return 0
    if not torch.cuda.is_available():
        print("gpu_reality: no CUDA device here; run this on a GPU host.")
        return 0

    free0, total = torch.cuda.mem_get_info()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def load(stop: threading.Event, a: Any = a) -> None:
        while not stop.is_set():
            for _ in range(50):
                a @ a
            torch.cuda.synchronize()

    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    used_mib = (total - free0) / MIB
    result["cuda_context"] = {"total_bytes": total, "free_after_init_bytes": free0, "used_mib": used_mib}
    result["nvml"] = nvml_check(load)
    del a
    torch.cuda.empty_cache()
    result["roofline"] = roofline_check(torch, result["device"], total)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    print(f"\n{result['device']}: {total / GIB:.1f} GiB, CUDA context {(total - free0) / MIB:.0f} MiB used")
    print(
        f"{'kind':8} {'tokens':>6} {'eager ms':>9} {'graph ms':>9} {'model ms':>9} "
        f"{'graph/model':>11} {'TB/s':>6}"
    )
    for r in result["roofline"]["rows"]:
        print(
            f"{r['kind']:8} {r['tokens']:>6} {r['measured_eager_ms']:>9} {r['measured_graph_ms']:>9} "
            f"{r['model_roofline_ms']:>9} {r['graph_vs_roofline']:>11} {r['achieved_bandwidth_tb_s']:>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
