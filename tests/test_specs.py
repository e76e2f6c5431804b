"""Hardware TOMLs and Hugging Face configs: every number sourced, bad files rejected by field."""

import json

import pytest

from costmodels.params import total_params
from costmodels.presets import PRESETS, load_model
from hardware_specs import SpecError, list_hardware, load_node
from hardware_specs.loader import DATA_DIR

REQUIRED = {"v100-sxm-32gb", "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-pcie-80gb",
            "h200-sxm-141gb", "b200", "mi300x", "l40s", "cpu"}


def test_all_required_hardware_presets_load():
    assert REQUIRED <= set(list_hardware())
    for name in list_hardware():
        node = load_node(name)
        assert node.gpus_per_node >= 1 and node.hardware.memory_bytes > 0


@pytest.mark.parametrize("old,new,needle", [
    ('"device.memory_gib" = ', '# "device.memory_gib" = ', "device.memory_gib.*sources"),  # unsourced number
    ("memory_gib = 80", 'memory_gib = "80"', "device.memory_gib.*a number"),  # wrong type
])
def test_bad_hardware_file_names_the_field(tmp_path, old, new, needle):
    bad = tmp_path / "node.toml"
    bad.write_text((DATA_DIR / "h100-sxm-80gb.toml").read_text().replace(old, new))
    with pytest.raises(SpecError, match=needle):
        load_node(str(bad))


LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192, "tie_word_embeddings": False}


def test_hf_llama_config_matches_the_preset(tmp_path):
    path = tmp_path / "Meta-Llama-3-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA3_8B))
    spec = load_model(str(path))
    assert spec.name == "Meta-Llama-3-8B"
    assert total_params(spec) == total_params(PRESETS["llama3-8b"])


@pytest.mark.parametrize("family,fields,expected", [
    ("gpt2", {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}, 124_439_808),
    ("mixtral", {**{k: v for k, v in LLAMA3_8B.items() if k != "model_type"}, "vocab_size": 32000,
                 "num_local_experts": 8, "num_experts_per_tok": 2}, 46_702_792_704),
    ("qwen2", {**{k: v for k, v in LLAMA3_8B.items() if k != "model_type"}, "hidden_size": 8192,
               "intermediate_size": 29568, "num_attention_heads": 64, "num_hidden_layers": 80,
               "vocab_size": 152064}, 72_706_203_648),
])
def test_hf_families(tmp_path, family, fields, expected):
    # GPT-2 small: 124,439,808 (openai-community/gpt2); the others as their presets.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": family, **fields}))
    assert total_params(load_model(str(path))) == expected


@pytest.mark.parametrize("content,needle", [
    ("[1, 2]", "JSON object"),
    (json.dumps({"model_type": "bert"}), "not supported"),
    (json.dumps({**LLAMA3_8B, "hidden_size": -1}), "hidden_size"),
    (json.dumps({k: v for k, v in LLAMA3_8B.items() if k != "num_hidden_layers"}), "num_hidden_layers"),
])
def test_malformed_configs_name_the_problem(tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(SpecError, match=needle):
        load_model(str(path))
