"""``plan --runtime R`` refuses, before searching, what R's job cannot run at any layout (issue 35):
one line, exit 2, naming the runtime(s) that can; and the defects the frameworks' real entry points
found in the exports, each held by a test that fails on the old export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodels.layout import Layout
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from framework_args import parse
from planner import api
from planner.cli import main
from planner.launch.frameworks import megatron_deepspeed_args
from planner.launch.job import write_job
from planner.launch.readback import launch_world_size
from planner.plan.plan_file import read_plan_file
from test_framework_jobs import at_release
from planner.search.framework_rules import runtime_refusal

SMALL = ["--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096"]


@pytest.mark.parametrize("model, runtime, options, says, can", [
    ("llama3-8b", "megatron", ["--lora-rank", "16"], "trains no LoRA adapters", "--runtime torch"),
    ("llama3-8b", "deepspeed", ["--lora-rank", "16"], "trains no LoRA adapters", "--runtime torch"),
    ("llama3-8b", "torchtitan", ["--precision", "fp16"], "fp16", "--runtime megatron"),
    ("llama3-8b", "torchtitan", ["--precision", "fp8", "--fp8-recipe", "delayed"], "recipe fp8-delayed",
     "--runtime megatron"),
    ("mistral-7b", "megatron", [], "sliding_window", "plan with --runtime torch"),
    ("gemma2-9b", "torchtitan", [], "sliding windows", "--runtime torch"),
])
def test_plan_refuses_in_one_line_naming_a_runtime_that_runs_it(model, runtime, options, says, can):
    result = CliRunner().invoke(main, ["plan", "--model", model, *SMALL, "--runtime", runtime, *options])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output
    assert f"--runtime {runtime} cannot run this job" in errors[0] and says in errors[0] and can in errors[0]


def test_the_api_raises_the_same_refusal():
    with pytest.raises(ValueError, match="cannot run this job: training.lora_rank = 16"):
        api.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096, lora_rank=16)


def test_what_every_runtime_runs_is_not_refused():
    assert runtime_refusal("megatron", load_model("llama3-8b"), TrainingSpec(global_batch_size=8, seq_len=1024)) is None


def test_megatron_rotary_base_of_a_million_is_an_integer_its_parser_takes(tmp_path):
    """Megatron-LM's --rotary-base is type=int: '1e+06' (the old ':g' text) is refused by its parser."""
    out = tmp_path / "plan.json"
    assert CliRunner().invoke(main, ["evaluate", "--model", "mixtral-8x7b", "--hardware", "h100-sxm-80gb",
                                     "--gpus", "64", "--global-batch", "512", "--seq-len", "4096", "--dp", "8",
                                     "--tp", "2", "--pp", "4", "--ep", "8", "--zero", "1", "--sequence-parallel",
                                     "--out", str(out)]).exit_code == 0
    write_job(read_plan_file(out), tmp_path / "job")
    text = (tmp_path / "job" / "megatron_args.sh").read_text(encoding="utf-8")
    assert "--rotary-base 1000000" in text and "1e+06" not in text


def test_megatron_deepspeed_arguments_carry_zero_stage_experts_tokenizer_and_rope():
    model = load_model("mixtral-8x7b")
    training = TrainingSpec(global_batch_size=256, seq_len=4096, runtime="deepspeed")
    layout = Layout(dp=16, tp=2, pp=1, ep=8, zero_stage=1, sequence_parallel=True, micro_batch_size=1,
                    num_microbatches=16)
    args = parse("megatron-deepspeed@4efb479d5317", megatron_deepspeed_args(model, training, layout))
    assert args.zero_stage == 1 and args.enable_expert_tensor_parallelism  # expert tp = tp = 2, as costed
    assert (args.tokenizer_type, args.vocab_size, args.rope_theta) == ("NullTokenizer", 32000, 1000000)
    zero3 = Layout(dp=16, tp=2, pp=1, zero_stage=3, sequence_parallel=True, micro_batch_size=1, num_microbatches=8)
    args = parse("megatron-deepspeed@4efb479d5317", megatron_deepspeed_args(
        load_model("llama3-8b"), training, zero3))
    assert args.zero_stage == 3 and args.rope_theta == 500000  # zero.Init builds the model sharded


def test_torchtitan_uneven_stages_name_the_output_head_torchtitan_builds(tmp_path):
    """torchtitan v0.2.2's llama3 calls its head ``output``: the last stage of an uneven split holds it."""
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["evaluate", "--model", "llama3-8b", *SMALL, "--runtime", "torchtitan",
                                       "--dp", "4", "--tp", "1", "--pp", "2", "--zero", "2",
                                       "--layers-per-chunk", "17,15", "--out", str(out)])
    assert result.exit_code == 0, result.output
    write_job(at_release(read_plan_file(out), "v0.2.2"), tmp_path / "job")
    run = subprocess.run([sys.executable, str(Path(__file__).parent / "torchtitan_build.py"), str(tmp_path / "job"),
                          str(launch_world_size(tmp_path / "job"))], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    stages = json.loads(run.stdout)[0]["stages"]
    assert stages[0][:2] == ["tok_embeddings", "layers.0"] and len(stages[0]) == 1 + 17
    assert stages[1][-3:] == ["layers.31", "norm", "output"] and len(stages[1]) == 15 + 2
