"""The ILP plan of a traced user model runs through ``autoplan launch`` under torchrun (CPU, gloo) and
trains exactly like a single process; ``shard --attach`` and ``launch`` refuse what they cannot apply.

One shared launch: ``evaluate --out`` (dp 2 x tp 2, ZeRO-3) -> ``shard --module ... --attach`` ->
``launch`` -> the generated ``launch.sh`` (4 processes). The reference is the parity harness's
single-process path (``planner.launch.torchjob.case_runner.run_case``) on the same user model, same global batch.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main

TESTS = Path(__file__).resolve().parent
FACTORY = "test_alpa_fixtures:tower_wide"
SEQ_LEN = 64
STEPS = 3
LR = 1e-2
LOSS_RTOL = 2e-5
NORM_RTOL = 1e-4


def _cli(args: list[str]):
    return CliRunner().invoke(main, [str(a) for a in args])


def _evaluate(out: Path, *, dp: int, tp: int, recompute: str = "none") -> Path:
    """A real plan file from the lead's ``evaluate --out`` (tiny-llama stands in for the user's model)."""
    result = _cli(["evaluate", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", dp * tp, "--global-batch", 8,
                   "--seq-len", SEQ_LEN, "--precision", "fp32", "--dp", dp, "--tp", tp, "--pp", 1, "--zero", 3,
                   "--micro-batch", 2, "--recompute", recompute, "--out", out])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("alpa_launch")
    plan = _evaluate(work / "plan.json", dp=2, tp=2)
    attached = _cli(["shard", "--module", FACTORY, "--input-shape", f"4,{SEQ_LEN}", "--tp", 2,
                     "--attach", plan, "--out", work / "plan_tp.json"])
    assert attached.exit_code == 0, attached.output
    launch = _cli(["launch", work / "plan_tp.json", "--out", work / "job"])
    assert launch.exit_code == 0, launch.output
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(work / "job" / "launch.sh"), "--steps", str(STEPS), "--lr", str(LR),
                           "--log-dir", str(work / "logs")], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = [json.loads(line) for line in (work / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {"work": work, "plan": json.loads((work / "plan_tp.json").read_text()), "metrics": metrics}


@pytest.fixture(scope="module")
def reference() -> dict:
    """Single process, no process group, same model, seed, data and global batch (8 = 2 x 4); once
    trained as the job is, once with lr 0 (weights frozen)."""
    import torch

    from planner.launch.torchjob.case_runner import run_case

    case = {"module": FACTORY, "layout": {"num_microbatches": 2, "micro_batch_size": 4}, "seq_len": SEQ_LEN,
            "steps": STEPS}
    return {lr: run_case({**case, "lr": lr}, torch.device("cpu")) for lr in (LR, 0.0)}


@pytest.mark.torchrun
def test_attached_plan_carries_the_ilp_plan_and_the_user_model(launched):
    plan = launched["plan"]
    assert plan["inputs"]["module"] == FACTORY and plan["inputs"]["input_shape"] == [4, SEQ_LEN]
    styles = {v.split(";")[0] for v in plan["best"]["tp_plan"].values()}
    assert {"colwise", "rowwise"} <= styles  # the ILP really splits the user's model
    assert set(plan["best"]["tp_plan"]) >= {"lookup", "proj", "trunk.0.inner", "trunk.1.outer"}
    assert json.loads((launched["work"] / "job" / "plan.json").read_text()) == plan
    header = (launched["work"] / "job" / "launch.sh").read_text().split("set -euo")[0]
    assert FACTORY in header and "PYTHONPATH" in header


@pytest.mark.torchrun
def test_job_splits_the_model_over_tp_and_dp(launched):
    """Parameters and AdamW's two states (12 bytes per fp32 parameter) per rank: about a quarter of the
    model's on 2 x 2 ranks (FSDP alone would leave a half; only the norms stay replicated over tp)."""
    import torch

    import test_alpa_fixtures as fx

    with torch.device("meta"):
        full_bytes = 12 * sum(p.numel() for p in fx.tower_wide().parameters())
    per_rank = max(m["tensor_bytes"] for m in launched["metrics"])
    assert 0.25 * full_bytes <= per_rank < 0.3 * full_bytes


@pytest.mark.torchrun
def test_generated_job_matches_single_process_loss(launched, reference):
    got, trained, frozen = launched["metrics"], reference[LR], reference[0.0]
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    for ref, still in zip(trained[1:], frozen[1:]):  # the updates move the loss far more than the tolerance
        assert abs(ref["loss"] - still["loss"]) > 100 * LOSS_RTOL * still["loss"]
    for step, (ref, run) in enumerate(zip(trained, got)):
        assert run["loss"] == pytest.approx(ref["loss"], rel=LOSS_RTOL), f"step {step + 1} loss"
        assert run["grad_norm"] == pytest.approx(ref["grad_norm"], rel=NORM_RTOL), f"step {step + 1} grad norm"


@functools.cache
def _preset_tp_plan() -> dict:
    """The ILP's tp_plan of autoplan's tiny-llama at tp 2, from ``autoplan shard``."""
    shard = _cli(["shard", "--model", "tiny-llama", "--input-shape", "4,32", "--tp", 2, "--hardware", "cpu",
                  "--dtype", "fp32", "--format", "json"])
    assert shard.exit_code == 0, shard.output
    return json.loads(shard.output)["tp_plan"]


def launch_cases() -> list[dict]:
    """tiny-llama with its ILP tp_plan (not the fixed Megatron plan) under full recomputation at tp 2,
    and the single-process reference (same model, seed and global batch 8 = 2 x 4)."""
    base = {"model": "tiny-llama", "seq_len": 32, "steps": STEPS}
    return [{**base, "name": "ilp-tp2-full", "tp_plan": _preset_tp_plan(),
             "layout": {"tp": 2, "recompute": "full", "num_microbatches": 2, "micro_batch_size": 4}},
            {**base, "name": "reference", "layout": {"num_microbatches": 2, "micro_batch_size": 4}}]


@pytest.fixture(scope="module")
def preset_parity(case_results) -> dict:
    """``launch_cases`` through the parity harness (the shared 2-process launch and plain process)."""
    results = case_results.of(launch_cases())
    return {"tp_plan": _preset_tp_plan(), "got": results["ilp-tp2-full"], "reference": results["reference"]}


@pytest.mark.torchrun
def test_preset_ilp_plan_under_recomputation_matches_single_process(preset_parity):
    assert preset_parity["tp_plan"]["layers.0.attention.wq"].startswith("colwise")  # the ILP's plan is applied
    for step, (ref, run) in enumerate(zip(preset_parity["reference"], preset_parity["got"], strict=True)):
        assert run["loss"] == pytest.approx(ref["loss"], rel=LOSS_RTOL), f"step {step + 1} loss"
        assert run["grad_norm"] == pytest.approx(ref["grad_norm"], rel=NORM_RTOL), f"step {step + 1} grad norm"


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("attach_bad")
    base = _evaluate(work / "plan.json", dp=2, tp=2)
    doc = json.loads(base.read_text())
    doc["best"]["layout"] |= {"pp": 2, "dp": 1, "num_microbatches": 2 * doc["best"]["layout"]["num_microbatches"]}
    (work / "pp2.json").write_text(json.dumps(doc))
    (work / "report.json").write_text(json.dumps({"tp_plan": {}, "solver": {}}))
    return {"base": base, "pp2": work / "pp2.json", "report": work / "report.json", "out": work / "new.json",
            "recompute": _evaluate(work / "recompute.json", dp=2, tp=2, recompute="full")}


@pytest.mark.parametrize("args, needle", [
    (["--module", FACTORY, "--tp", 4, "--attach", "base"], "--tp 4: the plan in"),
    (["--module", FACTORY, "--tp", 2, "--dp", 4, "--attach", "base"], "--dp 4: the plan in"),
    (["--module", FACTORY, "--tp", 2, "--attach", "report"], "no schema_version"),
    (["--module", FACTORY, "--tp", 2, "--attach", "missing"], "No such file or directory"),
    (["--module", FACTORY, "--tp", 2, "--attach", "pp2"], "layout.pp = 2"),
    (["--module", FACTORY, "--tp", 2, "--attach", "recompute"], "layout.recompute = full"),
    (["--model", "tiny-gpt", "--tp", 2, "--attach", "base"], "a different model"),
    (["--module", "test_alpa_fixtures:with_buffer", "--tp", 2, "--attach", "base"], "registers buffers (mask)"),
])
def test_attach_bad_input_is_one_line_exit_2(plans, args, needle):
    args = [plans.get(a, a) if a in ("base", "report", "pp2", "recompute") else a for a in args]
    args = [plans["out"].parent / "nope.json" if a == "missing" else a for a in args]
    result = _cli(["shard", *args, "--out", plans["out"]])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and needle in lines[0], result.output
    assert not plans["out"].exists()


def test_attach_needs_an_out_file(plans):
    result = _cli(["shard", "--module", FACTORY, "--tp", 2, "--attach", plans["base"]])
    assert result.exit_code == 2 and "--attach needs --out" in result.output


def test_launch_refuses_user_model_plans_it_cannot_apply(plans, tmp_path):
    doc = json.loads(plans["base"].read_text())
    doc["inputs"]["module"] = FACTORY  # tp 2 but no tp_plan: the fixed plan only fits autoplan's model
    (tmp_path / "no_tp_plan.json").write_text(json.dumps(doc))
    result = _cli(["launch", tmp_path / "no_tp_plan.json", "--out", tmp_path / "job"])
    assert result.exit_code == 2 and "needs a tensor-parallel plan" in result.output.strip().splitlines()[0]
    doc["best"]["tp_plan"] = {"proj": "diagonal"}
    (tmp_path / "bad_style.json").write_text(json.dumps(doc))
    result = _cli(["launch", tmp_path / "bad_style.json", "--out", tmp_path / "job"])
    assert result.exit_code == 2 and "best.tp_plan: unknown style 'diagonal'" in result.output
    assert not (tmp_path / "job").exists()


def test_plan_names_reach_modules_inside_recomputation_wrappers():
    """A preset's tp_plan names the unwrapped model; under full recomputation the job still finds them."""
    import torch

    from costmodels.layout import Layout
    from costmodels.presets import load_model
    from planner.launch.torchjob.model import Transformer
    from planner.launch.torchjob.parallel import apply_recompute
    from planner.launch.torchjob.tp_styles import resolve_names

    with torch.device("meta"):
        model = Transformer(load_model("tiny-llama"))
    apply_recompute(model, Layout(recompute="full"))
    resolved = resolve_names(model, {"layers.0.attention.wq": "colwise", "output": "colwise", "layers.1": "replicate"})
    assert resolved == {"layers.0._checkpoint_wrapped_module.attention.wq": "colwise", "output": "colwise",
                        "layers.1._checkpoint_wrapped_module": "replicate"}
    names = {name for name, _ in model.named_modules()}
    assert set(resolved) <= names


def test_user_model_vocabulary_and_contract():
    import torch
    from torch import nn

    import test_alpa_fixtures as fx
    from autoplan_base.errors import AutoplanError
    from planner.launch.torchjob.user_model import contract_problems, vocab_size

    with torch.device("meta"):
        assert vocab_size(fx.Mlp(vocab=128), 16) == 128  # V from the logits' last dim
        with pytest.raises(AutoplanError, match=r"must return float logits \[1, 8, V\], got \(1, 128\)"):
            vocab_size(nn.Sequential(nn.Embedding(32, 16), nn.Flatten()), 8)
        tied = fx.Mlp()
        tied.head.weight = tied.embed.weight
        assert contract_problems(fx.Tower(), splits_params=True) == []
        assert "tied weights" in contract_problems(tied, splits_params=True)[0]
        assert contract_problems(tied, splits_params=False) == []
