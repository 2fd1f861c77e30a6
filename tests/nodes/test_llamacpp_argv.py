"""llama.cpp's argv: a streamed answer is never cut short because another request arrived."""

from __future__ import annotations

from nodes.engines import llamacpp
from nodes.engines.base import EngineSpec


def test_llamacpp_does_not_interrupt_a_stream_for_the_next_request() -> None:
    spec = EngineSpec(
        model_path="/models/m.gguf",
        served_model_name="m",
        port=8100,
        api_key="k",
        bind_host="127.0.0.1",
        max_model_len=1024,
    )
    argv = llamacpp.build_argv(spec)
    # llama-cpp-python's default (true) ends a stream with [DONE] when a probe waits for the model.
    assert argv[argv.index("--interrupt_requests") + 1] == "false"
    assert argv[argv.index("--model") + 1] == "/models/m.gguf"


def test_llamacpp_key_is_in_the_environment_not_the_command_line() -> None:
    spec = EngineSpec(model_path="/models/m.gguf", served_model_name="m", port=8100, api_key="k-secret")
    argv = llamacpp.build_argv(spec)
    assert "k-secret" not in argv and "--api_key" not in argv
    # llama_cpp.server's settings are pydantic-settings fields: API_KEY fills api_key.
    assert llamacpp.build_env(spec)["API_KEY"] == "k-secret"
