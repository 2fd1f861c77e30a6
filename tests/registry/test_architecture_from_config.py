"""config.json normalisation: nested text configs, defaults, and clear errors for bad values."""

from __future__ import annotations

import pytest

from models_registry.estimate import ArchitectureError, architecture_from_config

BASE = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "vocab_size": 32000,
}


def test_kv_heads_default_to_attention_heads_and_head_dim_to_hidden_over_heads() -> None:
    arch = architecture_from_config(BASE)
    assert (arch["num_kv_heads"], arch["head_dim"], arch["intermediate_size"]) == (32, 128, 4 * 4096)
    assert arch["dtype"] == "float16"


def test_multimodal_wrapper_reads_its_text_config() -> None:
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {**BASE, "num_key_value_heads": 8, "head_dim": 256},
    }
    arch = architecture_from_config(config)
    assert (arch["num_layers"], arch["num_kv_heads"], arch["head_dim"]) == (32, 8, 256)
    assert arch["dtype"] == "bfloat16"
    assert arch["architectures"] == ["Gemma3ForConditionalGeneration"]


def test_multi_query_attention_has_one_kv_head() -> None:
    config = {"model_type": "falcon", "hidden_size": 4544, "n_layer": 32, "n_head": 71, "vocab_size": 65024}
    arch = architecture_from_config({**config, "multi_query": True})
    assert arch["num_kv_heads"] == 1
    assert arch["head_dim"] == 64


def test_checkpoint_quantization_is_recorded() -> None:
    config = {**BASE, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    assert architecture_from_config(config)["checkpoint_quantization"] == {
        "method": "awq",
        "bits": 4,
        "group_size": 128,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers must be a positive integer"),
        ({"hidden_size": 0}, "hidden_size must be a positive integer"),
        ({"num_attention_heads": "32"}, "num_attention_heads must be a positive integer"),
        ({"num_key_value_heads": True}, "num_key_value_heads must be a positive integer"),
        ({"vocab_size": -1}, "vocab_size must be a positive integer"),
    ],
)
def test_bad_values_name_the_field(change: dict[str, object], message: str) -> None:
    with pytest.raises(ArchitectureError, match=message):
        architecture_from_config({**BASE, **change})


def test_not_an_object() -> None:
    with pytest.raises(ArchitectureError, match="expected a JSON object"):
        architecture_from_config([1, 2])  # type: ignore[arg-type]
