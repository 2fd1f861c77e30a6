"""Sleep mode at launch: vLLM and the simulator get `--enable-sleep-mode` (a documented serve flag) and
`VLLM_SERVER_DEV_MODE=1` only when sleep is configured; llama.cpp never; extra_args cannot set it."""

from __future__ import annotations

from nodes.engines import llamacpp, sim, vllm
from nodes.engines.vllm import check_extra_args
from tests.nodes.test_vllm_argv import documented_flags, spec


def test_sleep_mode_flag_and_dev_mode_only_when_configured() -> None:
    assert "--enable-sleep-mode" in documented_flags()
    for adapter in (vllm, sim):
        on, off = spec(enable_sleep_mode=True), spec()
        assert "--enable-sleep-mode" in adapter.build_argv(on)
        assert adapter.build_env(on)["VLLM_SERVER_DEV_MODE"] == "1"
        assert "--enable-sleep-mode" not in adapter.build_argv(off)
        assert "VLLM_SERVER_DEV_MODE" not in adapter.build_env(off)
    assert "VLLM_SERVER_DEV_MODE" not in llamacpp.build_env(spec(enable_sleep_mode=True))


def test_extra_args_cannot_turn_it_on_behind_the_form() -> None:
    problems = check_extra_args(["--enable-sleep-mode"])
    assert problems and "sleep_enabled" in problems[0]
