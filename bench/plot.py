"""Latency and throughput against load, as PNG and SVG (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(report: dict[str, Any], path: Path) -> list[Path]:
    """Write `path` with .png and .svg suffixes; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["levels"]
    closed = all(lv.get("clients") is not None for lv in levels)
    x = [lv["clients"] if closed else lv["rate"] for lv in levels]
    xlabel = "concurrent clients" if closed else "offered load (requests/s)"

    def series(metric: str, q: str) -> list[float]:
        return [float("nan") if (v := lv[metric][q]) is None else v * 1000 for lv in levels]

    fig, (ax_lat, ax_tput) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    ax_lat.plot(x, series("ttft_s", "p50"), "o-", label="TTFT p50")
    ax_lat.plot(x, series("ttft_s", "p99"), "o--", label="TTFT p99")
    ax_lat.plot(x, series("itl_s", "p50"), "s-", label="ITL p50")
    ax_lat.plot(x, series("latency_s", "p50"), "^-", label="end-to-end p50")
    ax_lat.set_yscale("log")
    ax_lat.set_xlabel(xlabel)
    ax_lat.set_ylabel("milliseconds (log)")
    ax_lat.set_title("Latency")
    ax_tput.plot(x, [lv["output_tokens_per_s"] for lv in levels], "o-", label="output tokens/s")
    ax_tput.set_xlabel(xlabel)
    ax_tput.set_ylabel("output tokens/s")
    ax_tput.set_title("Throughput")
    ax_good = ax_tput.twinx()
    ax_good.plot(
        x, [lv["goodput_requests_per_s"] for lv in levels], "s--", color="tab:green", label="goodput (req/s)"
    )
    ax_good.plot(x, [lv["requests_per_s"] for lv in levels], "^:", color="tab:gray", label="requests/s")
    ax_good.set_ylabel("requests/s")
    knee = report.get("knee_index")
    if knee is not None:
        for ax in (ax_lat, ax_tput):
            ax.axvline(x[knee], color="tab:red", alpha=0.4, linestyle=":")
    ax_lat.legend(fontsize=8)
    handles = ax_tput.get_legend_handles_labels()[0] + ax_good.get_legend_handles_labels()[0]
    ax_tput.legend(handles=handles, fontsize=8, loc="upper left")
    slo = report["slo"]
    fig.suptitle(
        f"{report['model']} at {report['target']}  (goodput SLO: TTFT < {slo['ttft_s'] * 1000:g} ms, "
        f"TPOT < {slo['itl_s'] * 1000:g} ms)",
        fontsize=9,
    )
    written = []
    for suffix in (".png", ".svg"):
        out = path.with_suffix(suffix)
        fig.savefig(out, dpi=110)
        written.append(out)
    plt.close(fig)
    return written
