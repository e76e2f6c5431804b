"""``explain`` explains: binding constraint, why the runner-up lost, what would change (issue #17)."""

import json

from click.testing import CliRunner

import planner
from planner.cli import main
from planner.explain import binding_constraint, explain, runner_up_differences


def _plan_file(**request):
    return planner.plan(**request).to_plan_file()


def test_binding_constraint_names_memory_or_the_largest_time_term():
    plan = _plan_file(model="llama3-8b", hardware="h100-sxm-80gb", gpus=16, global_batch=64, seq_len=4096)
    bind = binding_constraint(plan.best)
    times = plan.best.predicted["time_s"]
    if bind["kind"] == "time":
        assert bind["term"] == max(times, key=times.get)
    else:
        assert plan.best.predicted["peak_memory_gib"] >= 0.9 * plan.best.predicted["memory_capacity_gib"]


def test_runner_up_differences_are_the_terms_that_differ_with_their_numbers():
    plan = _plan_file(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=512, seq_len=8192)
    diff = runner_up_differences(plan.best, plan.candidates[0])
    assert diff["terms"]
    for d in diff["terms"]:
        field = "time_s" if d["unit"] == "s" else "memory_gib"
        assert d["best"] == plan.best.predicted[field].get(d["term"], 0.0)
        assert d["difference"] == d["runner_up"] - d["best"] != 0


def test_what_would_change_is_computed_by_the_search():
    plan = _plan_file(model="llama3-8b", hardware="h100-sxm-80gb", gpus=16, global_batch=64, seq_len=4096)
    cases = {c["change"]: c for c in explain(plan)["what_would_change"]}
    doubled = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=16, global_batch=128, seq_len=4096)
    assert cases["global batch 128"]["step_time_s"] == doubled.best.step_time_s
    assert "2x the NIC bandwidth" in cases


def test_explain_format_json_prints_one_document(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=16, global_batch=64,
                                 seq_len=4096).to_json())
    result = CliRunner().invoke(main, ["explain", str(path), "--format", "json"])
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert set(doc) == {"best", "runtime", "binding", "ties", "runner_up", "what_would_change"}
    assert doc["ties"]["num_indistinguishable"] >= 1 and doc["ties"]["band_rel"] > 0
    table = CliRunner().invoke(main, ["explain", str(path)]).stdout
    assert "why this plan:" in table and "runner-up" in table and "with 2x the NIC bandwidth" in table
    assert doc["runtime"] in table.splitlines() and doc["ties"]["text"] in table.splitlines()


def test_explain_lists_memory_and_time_in_the_order_plan_prints_them(tmp_path):
    """A plan file stores its keys sorted; ``explain`` still prints params, grads, optimizer,
    activations ... and compute before the communication terms, as ``plan`` does."""
    out = tmp_path / "plan.json"
    args = ["--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64",
            "--seq-len", "4096"]
    planned = CliRunner().invoke(main, ["plan", *args], terminal_width=120)
    CliRunner().invoke(main, ["plan", *args, "--out", str(out)])
    explained = CliRunner().invoke(main, ["explain", str(out)], terminal_width=120)
    assert planned.exit_code == explained.exit_code == 0

    def first_column(text: str) -> list[str]:
        rows = text.split("memory/GPU GiB", 1)[1].split("sources:", 1)[0].splitlines()[1:]
        return [row.split()[0] for row in rows if row.strip()]

    assert first_column(explained.output)[:4] == ["params", "grads", "optimizer", "activations"]
    assert first_column(explained.output) == first_column(planned.output)
