"""The CLI through CliRunner and as a real subprocess: outputs, determinism, bad input, exit codes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main

JOB = ["--model", "llama2-7b", "--hardware", "a100-sxm-80gb", "--gpus", "16", "--global-batch", "64",
       "--seq-len", "2048"]


def run(args):
    return CliRunner().invoke(main, args)


def test_plan_table_names_the_layout_and_figures():
    result = run(["plan", *JOB])
    assert result.exit_code == 0, result.output
    for text in ("best:", "tokens/s", "MFU", "peak memory", "alternatives"):
        assert text in result.output


def test_plan_json_is_json_only_and_has_the_contract_fields():
    result = run(["plan", *JOB, "--format", "json", "--top", "3"])
    data = json.loads(result.stdout)
    assert set(data) >= {"schema_version", "inputs", "best", "candidates", "search"}
    layout = data["best"]["layout"]
    assert layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"] == 16
    assert layout["dp"] * layout["micro_batch_size"] * layout["num_microbatches"] == 64
    pred = data["best"]["predicted"]
    assert pred["fits"] and pred["peak_memory_gib"] <= pred["memory_capacity_gib"]
    # Each printed time term is the API's figure for the same layout (six significant digits).
    from costmodels.breakdown import TIME_TERMS
    from costmodels.layout import Layout
    import planner

    again = planner.evaluate(model="llama2-7b", hardware="a100-sxm-80gb", gpus=16, global_batch=64, seq_len=2048,
                             layout=Layout.from_dict(layout))
    assert pred["time_s"] == {t.removesuffix("_s"): pytest.approx(getattr(again, t), rel=1e-5) for t in TIME_TERMS}
    assert pred["step_time_s"] == pytest.approx(again.step_time_s, rel=1e-5)
    assert len(data["candidates"]) == 3


def test_plan_out_is_byte_identical_for_the_same_inputs(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run(["plan", *JOB, "--out", str(a)]).exit_code == 0
    assert run(["plan", *JOB, "--out", str(b), "--format", "json"]).exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    assert "seconds" not in json.loads(a.read_text())["search"]


def test_evaluate_json_prints_one_plan_and_explain_reads_the_file(tmp_path):
    out = tmp_path / "eval.json"
    result = run(["evaluate", *JOB, "--dp", "4", "--tp", "2", "--pp", "2", "--zero", "1", "--micro-batch", "2",
                  "--schedule", "interleaved", "--virtual-stages", "2", "--recompute", "selective",
                  "--format", "json"])
    assert result.exit_code == 0, result.output
    single = json.loads(result.stdout)
    assert set(single) == {"layout", "predicted"} and single["layout"]["num_microbatches"] == 8
    written = run(["evaluate", *JOB, "--dp", "4", "--tp", "2", "--pp", "2", "--zero", "1", "--micro-batch", "2",
                   "--schedule", "interleaved", "--virtual-stages", "2", "--recompute", "selective",
                   "--format", "json", "--out", str(out)])
    assert written.exit_code == 0 and written.stdout == ""  # with --out, stdout stays empty
    explained = run(["explain", str(out)])
    assert explained.exit_code == 0 and "dp 4 · tp 2 · pp 2" in explained.output


def test_models_and_hardware_list_presets():
    models = json.loads(run(["models", "--format", "json"]).stdout)
    assert models["llama3-70b"]["params"] == 70_553_706_496
    hardware = json.loads(run(["hardware", "--format", "json"]).stdout)
    assert hardware["h100-sxm-80gb"]["tflops"]["bf16"] == 989


def test_the_hardware_listing_shows_a_bf16_rate_exactly_where_plan_costs_bf16():
    """Before: v100-sxm-32gb listed 'bf16 TF 125' (its fp16 rate), which plan refuses: it has no bf16."""
    from hardware_specs import list_hardware
    from planner import SpecError, resolve_job

    lines = run(["hardware", "--format", "tsv"]).stdout.splitlines()
    header = lines[0].split("\t")
    cells = {line.split("\t")[0]: dict(zip(header, line.split("\t"))) for line in lines[1:]}
    assert cells["v100-sxm-32gb"]["bf16 TF"] == "-" and cells["v100-sxm-32gb"]["fp16 TF"] == "125"
    for name in list_hardware():
        try:
            resolve_job(model="tiny-llama", hardware=name, gpus=1, global_batch=1, seq_len=128, precision="bf16")
            plans_bf16 = True
        except SpecError:
            plans_bf16 = False
        assert (cells[name]["bf16 TF"] != "-") == plans_bf16, name


def _float_options():
    """(command path, option) of every float option of every command."""
    import click

    from planner.cli.common import FiniteFloat

    def walk(command, path):
        for sub in getattr(command, "commands", {}).values():
            yield from walk(sub, [*path, sub.name])
        for param in command.params:
            if isinstance(param.type, (click.types.FloatParamType, FiniteFloat)):
                yield path, param

    return list(walk(main, []))


def test_every_float_option_refuses_nan_and_inf():
    """Before: 'shard --time-limit nan' (and inf) ran and exited 0; FloatRange lets nan through."""
    from planner.cli.common import FiniteFloat

    options = _float_options()
    assert {param.opts[0] for _, param in options} >= {"--time-limit", "--memory-fraction", "--moe-imbalance",
                                                       "--lr", "--min-lr-ratio"}
    for path, param in options:
        assert isinstance(param.type, FiniteFloat), (path, param.opts)
        for bad in ("nan", "inf", "-inf"):
            with pytest.raises(Exception) as info:
                param.type.convert(bad, param, None)
            assert f"{bad} is not a finite number" in str(info.value)


@pytest.mark.parametrize("value", ["nan", "inf", "1e300"])
def test_shard_time_limit_must_be_finite_and_sane(value):
    result = run(["shard", "--model", "tiny-llama", "--tp", "2", "--time-limit", value])
    assert result.exit_code == 2 and "'--time-limit'" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["plan", "--model", "llama3-7b", *JOB[2:]], "did you mean"),
    (["plan", *JOB[:2], "--hardware", "h100x", *JOB[4:]], "--hardware"),
    (["plan", *JOB[:4], "--gpus", "0", *JOB[6:]], "--gpus"),
    (["plan", *JOB[:4], "--gpus", "12", *JOB[6:]], "multiple of 8"),
    (["plan", *JOB, "--memory-fraction", "1.5"], "--memory-fraction"),
    (["plan", *JOB[:2], "--hardware", "v100-sxm-32gb", *JOB[4:]], "--precision"),
    (["evaluate", *JOB, "--dp", "3", "--tp", "2", "--pp", "2"], "global-batch"),
    (["evaluate", *JOB, "--dp", "2", "--tp", "2", "--pp", "2"], "but --gpus 16"),
    (["evaluate", *JOB, "--dp", "4", "--tp", "2", "--pp", "2", "--virtual-stages", "2"], "interleaved"),
    (["evaluate", "--model", "tiny-gpt", *JOB[2:], "--dp", "2", "--tp", "8", "--pp", "1"], "4 attention heads"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    result = run(args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output


def test_bad_files_are_one_line_exit_2(tmp_path):
    broken = tmp_path / "config.json"
    broken.write_text("{ not json")
    assert "not valid JSON" in run(["plan", "--model", str(broken), *JOB[2:]]).output
    toml = tmp_path / "node.toml"
    toml.write_text("schema_version = 1\nname = [")
    result = run(["plan", *JOB[:2], "--hardware", str(toml), *JOB[4:]])
    assert result.exit_code == 2 and "not valid TOML" in result.output
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema_version": 99}))
    result = run(["explain", str(plan)])
    assert result.exit_code == 2 and "schema_version" in result.output


def test_infeasible_request_exits_1_with_closest_miss(tmp_path):
    out = tmp_path / "plan.json"
    result = run(["plan", "--model", "llama3-405b", "--hardware", "a100-sxm-40gb", "--gpus", "8",
                  "--global-batch", "8", "--seq-len", "4096", "--out", str(out)])
    assert result.exit_code == 1
    assert "no layout fits in memory" in result.stderr and "model states need" in result.stderr
    assert "--gpus " in result.stderr and "ZeRO-3 (--zero 3)" not in result.stderr  # only what would fit
    data = json.loads(out.read_text())
    assert data["best"] is None and data["closest_misses"][0]["needed_gib"] > data["closest_misses"][0]["available_gib"]


def test_out_is_not_written_on_error(tmp_path):
    out = tmp_path / "plan.json"
    run(["plan", "--model", "nope", *JOB[2:], "--out", str(out)])
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_real_subprocess_plan_and_usage_error():
    exe = Path(sys.executable).with_name("autoplan")
    ok = subprocess.run([str(exe), "plan", *JOB, "--format", "json"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and json.loads(ok.stdout)["best"]["predicted"]["fits"]
    bad = subprocess.run([str(exe), "plan", "--model", "gpt5", *JOB[2:]], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "gpt5" in bad.stderr


def test_launchable_plans_pass_the_launch_rule():  # cp, ep and offload are launched since issue 13
    from costmodels.layout import Layout
    from planner.search.launchable import launch_problems
    from planner.plan.plan_file import PlanFile

    result = run(["plan", "--model", "mixtral-8x7b", "--hardware", "h100-sxm-80gb", "--gpus", "32",
                  "--global-batch", "64", "--seq-len", "8192", "--launchable", "--format", "json"])
    plan = PlanFile.from_json(result.stdout)
    model, training = plan.inputs.model_spec, plan.inputs.training
    for entry in [plan.best, *plan.candidates]:
        assert launch_problems(model, training, entry.layout) == []
        assert isinstance(entry.layout, Layout)
    assert training.runtime == "torch"


def test_launchable_refuses_the_megatron_runtime():
    result = run(["plan", "--model", "llama2-7b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8",
                  "--seq-len", "2048", "--launchable", "--runtime", "megatron"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "warning: --launchable is deprecated; it means --runtime torch",
        "error: --runtime megatron with --launchable: the launched job runs on PyTorch's APIs; "
        "drop --launchable (it means --runtime torch)"]


def test_explain_shows_an_attached_tp_plan(tmp_path):
    out = tmp_path / "plan.json"
    assert run(["evaluate", *JOB, "--dp", "8", "--tp", "2", "--pp", "1", "--out", str(out)]).exit_code == 0
    data = json.loads(out.read_text())
    data["best"]["tp_plan"] = {"layers.0.attention.wq": "colwise", "layers.0.attention.wo": "rowwise"}
    out.write_text(json.dumps(data))
    result = run(["explain", str(out)])
    assert result.exit_code == 0
    assert "tensor-parallel plan from the ILP (2 modules)" in result.output
    assert "layers.0.attention.wo: rowwise" in result.output


@pytest.mark.parametrize("args, needle", [
    (["plan", *JOB, "--precision", "fp64"], "'--precision'"),
    (["plan", *JOB, "--runtime", "jax"], "'--runtime'"),
    (["plan", *JOB[2:]], "'--model'"),
    (["plans"], "'plans'"),
])
def test_usage_errors_are_one_line_exit_2(args, needle):
    """click's usage errors (bad choice, missing option, unknown command) print one line, not the
    usage text, and exit 2."""
    result = run(args)
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and result.output.count("\n") == 1 and needle in result.output
