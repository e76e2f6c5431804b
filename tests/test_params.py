"""Parameter counts of the presets against published figures.

Exact counts are those of the released checkpoints (Hugging Face model cards / safetensors
metadata); GPT-3 sizes are the rounded labels of Brown et al. 2020, Table 2.1, so their tolerance
is half a unit of the last published digit where that exceeds 1%.
"""

import pytest

from costmodels.params import active_params, total_params
from costmodels.presets import PRESETS

# (preset, published total, tolerance as a fraction, source)
PUBLISHED = [
    ("gpt3-1.3b", 1.3e9, 0.05 / 1.3, "Brown et al. 2020, Table 2.1: 1.3B (two digits: +-0.05B)"),
    ("gpt3-2.7b", 2.7e9, 0.05 / 2.7, "Brown et al. 2020, Table 2.1: 2.7B (two digits: +-0.05B)"),
    ("gpt3-6.7b", 6.7e9, 0.01, "Brown et al. 2020, Table 2.1: 6.7B"),
    ("gpt3-13b", 13e9, 0.5 / 13, "Brown et al. 2020, Table 2.1: 13B (two digits: +-0.5B)"),
    ("gpt3-175b", 175e9, 0.01, "Brown et al. 2020, Table 2.1: 175B"),
    ("llama2-7b", 6_738_415_616, 0.01, "meta-llama/Llama-2-7b-hf: 6,738,415,616"),
    ("llama2-13b", 13_015_864_320, 0.01, "meta-llama/Llama-2-13b-hf: 13,015,864,320"),
    ("llama2-70b", 68_976_648_192, 0.01, "meta-llama/Llama-2-70b-hf: 68,976,648,192"),
    ("llama3-8b", 8_030_261_248, 0.01, "meta-llama/Meta-Llama-3-8B: 8.03B"),
    ("llama3-70b", 70_553_706_496, 0.01, "meta-llama/Meta-Llama-3-70B: 70.6B"),
    ("llama3-405b", 405_853_388_800, 0.01, "meta-llama/Llama-3.1-405B: 405.9B (Dubey et al. 2024: 405B)"),
    ("mistral-7b", 7_241_732_096, 0.01, "mistralai/Mistral-7B-v0.1: 7.24B"),
    ("mixtral-8x7b", 46_702_792_704, 0.01, "mistralai/Mixtral-8x7B-v0.1: 46.7B (Jiang et al. 2024: 47B)"),
    ("mixtral-8x22b", 140_630_071_296, 0.01, "mistralai/Mixtral-8x22B-v0.1: 141B"),
    ("qwen2.5-72b", 72_706_203_648, 0.01, "Qwen/Qwen2.5-72B model card: 72.7B"),
]


@pytest.mark.parametrize("name,published,tolerance,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_preset_matches_published_parameter_count(name, published, tolerance, source):
    count = total_params(PRESETS[name])
    assert abs(count - published) <= tolerance * published, f"{name}: {count:,} vs {source}"


def test_mixtral_active_parameters_match_published():
    # Jiang et al. 2024 (Mixtral of Experts), Sec. 2: 13B active of 47B; model card: 12.9B active.
    assert abs(active_params(PRESETS["mixtral-8x7b"]) - 12.9e9) <= 0.01 * 12.9e9
    # Mixtral 8x22B announcement: 39B active of 141B.
    assert abs(active_params(PRESETS["mixtral-8x22b"]) - 39e9) <= 0.01 * 39e9


def test_tiny_models_have_a_few_million_parameters():
    for name in ("tiny-llama", "tiny-gpt", "tiny-mixtral"):
        assert 1e6 <= total_params(PRESETS[name]) <= 10e6


def test_llama2_7b_count_by_hand():
    # 32 layers x (4·4096² attention + 3·4096·11008 MLP + 2·4096 norms) + 2·32000·4096 + 4096.
    layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert total_params(PRESETS["llama2-7b"]) == 32 * layer + 2 * 32000 * 4096 + 4096
