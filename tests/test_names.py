"""Names users type, and tables that never cut them (issue #17)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodels.presets import PRESETS, load_model
from hardware_specs import list_hardware, load_node
from autoplan_base.errors import SpecError
from planner.cli import main
from planner.cli.presets import count_text


@pytest.mark.parametrize("typed,full", [("h100", "h100-sxm-80gb"), ("H100", "h100-sxm-80gb"),
                                        ("h200", "h200-sxm-141gb"), ("H100-SXM-80GB", "h100-sxm-80gb")])
def test_case_insensitive_and_short_hardware_names(typed, full):
    from hardware_specs.loader import hardware_name

    assert hardware_name(typed) == full
    assert load_node(typed) == load_node(full)


def test_an_ambiguous_short_name_is_refused_with_the_candidates():
    with pytest.raises(SpecError, match="a100-sxm-40gb, a100-sxm-80gb"):
        load_node("a100")


def test_suggestions_go_by_token_not_to_b200():
    with pytest.raises(SpecError) as err:
        load_node("h100x")
    assert "b200" not in str(err.value)
    with pytest.raises(SpecError) as err:
        load_model("llama3-7b")
    suggested = str(err.value).split("did you mean ")[1].split("?")[0].split(", ")
    assert "llama3-8b" in suggested and all(name.startswith("llama3") for name in suggested)


@pytest.mark.parametrize("typed, meant", [("h10O", "h100-sxm-80gb"), ("h1OO", "h100-sxm-80gb"),
                                         ("a1OO", "a100-sxm-40gb"), ("mi3OOx", "mi300x"), ("b2OO", "b200")])
def test_typos_of_hardware_names_get_suggestions(typed, meant):
    with pytest.raises(SpecError) as err:
        load_node(typed)
    suggested = str(err.value).split("did you mean ")[1].split("?")[0].split(", ")
    assert suggested[0] == meant and len(suggested) <= 3


def test_a_name_like_nothing_gets_no_suggestion():
    with pytest.raises(SpecError) as err:
        load_node("zzzz")
    assert "did you mean" not in str(err.value)


def test_the_expansion_is_said_on_stderr_and_the_plan_file_holds_the_full_name():
    autoplan = str(Path(sys.executable).parent / "autoplan")
    result = subprocess.run([autoplan, "plan", "--model", "TINY-LLAMA", "--hardware", "CPU",
                             "--gpus", "2", "--global-batch", "4", "--seq-len", "64", "--format", "json"],
                            capture_output=True, text=True, check=True)
    assert "TINY-LLAMA means tiny-llama" in result.stderr
    assert json.loads(result.stdout)["inputs"]["model"] == "tiny-llama"


def test_a_hugging_face_model_directory_is_a_model(tmp_path):
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
              "max_position_embeddings": 8192, "rope_theta": 500000.0}
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(json.dumps(config))
    spec = load_model(str(tmp_path / "my-model"))
    assert (spec.num_layers, spec.max_position_embeddings, spec.rope_theta) == (2, 8192, 500000.0)
    with pytest.raises(SpecError, match="holds no config.json"):
        load_model(str(tmp_path))


def test_presets_match_the_released_configs():
    # max_position_embeddings / rope_theta of each released config.json (meta-llama/Meta-Llama-3-70B:
    # 8192, 500000; Llama 2: 4096; Llama 3.1 405B: 131072; Mixtral-8x22B: 65536, 1e6; Qwen2.5-72B: 131072, 1e6).
    assert (PRESETS["llama3-70b"].max_position_embeddings, PRESETS["llama3-70b"].rope_theta) == (8192, 500000.0)
    assert PRESETS["llama3-8b"].max_position_embeddings == 8192
    assert PRESETS["llama2-7b"].max_position_embeddings == 4096
    assert PRESETS["llama3-405b"].max_position_embeddings == 131072
    assert (PRESETS["mixtral-8x22b"].max_position_embeddings, PRESETS["mixtral-8x22b"].rope_theta) == (65536, 1e6)
    assert PRESETS["qwen2.5-72b"].rope_theta == 1e6


def test_small_counts_read_in_millions():
    assert count_text(6_300_000) == "6.3M"
    assert count_text(6_738_415_616) == "6.74B"
    assert count_text(405_000_000_000) == "405B"


@pytest.mark.parametrize("command,names", [("models", list(PRESETS)), ("hardware", list_hardware())])
def test_tables_never_cut_names_even_in_a_narrow_pipe(command, names):
    for width in ("60", "80"):
        out = CliRunner().invoke(main, [command], env={"COLUMNS": width}).output
        assert "…" not in out
        for name in names:
            assert name in out.split()


@pytest.mark.parametrize("command,names", [("models", list(PRESETS)), ("hardware", list_hardware())])
def test_tsv_has_one_header_and_one_row_per_preset(command, names):
    lines = CliRunner().invoke(main, [command, "--format", "tsv"]).output.splitlines()
    assert lines[0].startswith("name\t")
    assert [line.split("\t")[0] for line in lines[1:]] == names
    assert len({len(line.split("\t")) for line in lines}) == 1
