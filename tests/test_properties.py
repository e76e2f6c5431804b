"""Property tests (hypothesis) over specs, layouts, plan files and CLI arguments.

Each property: any value either builds, or raises a ``ValueError`` subclass (the CLI: exit 0, 1 or
2 with one line on stderr), never another exception. Budgets are bounded so the file runs in
seconds (``max_examples`` per test, no deadline on a shared machine).
"""

import json
import math

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec, MoESpec, model_from_dict
from costmodels.training import TrainingSpec
from planner.cli import main
from planner.plan.plan_file import PlanFile
from planner.search.factors import divisors

BUDGET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLI_BUDGET = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

anything = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=3),
    st.tuples(st.integers(-3, 9)), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
small_int = st.one_of(st.integers(min_value=-2, max_value=64), anything)


def builds_or_value_error(make) -> object:
    try:
        return make()
    except ValueError:
        return None


@BUDGET
@given(st.fixed_dictionaries({}, optional={name: small_int for name in Layout.__dataclass_fields__}))
def test_layout_builds_or_raises_value_error(fields):
    layout = builds_or_value_error(lambda: Layout(**fields))
    if layout is not None:
        assert layout.world_size >= 1 and all(n >= 1 for n in layout.layers_per_chunk)
        assert Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout


MODEL_FIELDS = dict(name="m", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                    num_kv_heads=2, vocab_size=100)


@BUDGET
@given(st.sampled_from(sorted(ModelSpec.__dataclass_fields__)), anything)
def test_model_spec_builds_or_raises_value_error(field, value):
    spec = builds_or_value_error(lambda: ModelSpec(**{**MODEL_FIELDS, field: value}))
    if spec is not None:
        assert spec.d_head >= 1 and spec.q_dim >= 1
        assert model_from_dict(json.loads(json.dumps(
            {**{k: getattr(spec, k) for k in ModelSpec.__dataclass_fields__}, "moe": None}))).name == spec.name


@BUDGET
@given(st.sampled_from(sorted(MoESpec.__dataclass_fields__)), anything)
def test_moe_spec_builds_or_raises_value_error(field, value):
    moe = builds_or_value_error(lambda: MoESpec(**{"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32,
                                                   field: value}))
    if moe is not None:
        assert 1 <= moe.top_k <= moe.num_experts and math.isfinite(moe.capacity_factor)


@BUDGET
@given(st.sampled_from(sorted(TrainingSpec.__dataclass_fields__)), anything)
def test_training_spec_builds_or_raises_value_error(field, value):
    spec = builds_or_value_error(lambda: TrainingSpec(**{"global_batch_size": 8, "seq_len": 128, field: value}))
    if spec is not None:
        assert 1 <= spec.tokens_per_step <= 2**40


@BUDGET
@given(st.integers(min_value=1, max_value=10**30))
def test_divisors_divide_and_pair_up(n):
    found = divisors(n)
    assert found[0] == 1 and found[-1] == n and all(n % d == 0 for d in found)
    assert [n // d for d in reversed(found)] == found


@BUDGET
@given(st.sampled_from(["gpus", "global_batch", "seq_len", "gpus_per_node", "memory_fraction", "precision",
                        "lora_rank", "profile", "top_k", "solver", "launchable"]), anything)
def test_plan_arguments_raise_only_value_errors(name, value):
    args = {**dict(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=128), name: value}
    report = builds_or_value_error(lambda: planner.plan(**args))
    if report is not None:
        assert math.isfinite(json.loads(report.to_json())["search"]["space_size"])


_PLAN_TEXT: list[str] = []


def _plan_text() -> str:
    if not _PLAN_TEXT:
        _PLAN_TEXT.append(planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8,
                                       seq_len=128).to_json())
    return _PLAN_TEXT[0]


def _paths(doc, prefix=()):
    """Every (path, value) in a JSON document."""
    yield prefix, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _paths(value, prefix + (i,))


@BUDGET
@given(st.data())
def test_corrupt_plan_files_raise_only_value_errors(data):
    doc = json.loads(_plan_text())
    paths = [p for p, _ in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(st.one_of(anything.filter(lambda v: not (isinstance(v, float) and not math.isfinite(v))),
                                st.just("__delete__")))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if value == "__delete__" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    plan = builds_or_value_error(lambda: PlanFile.from_json(json.dumps(doc)))
    if plan is not None:
        assert PlanFile.from_json(plan.to_json()) == plan


OPTIONS = ["--gpus", "--global-batch", "--seq-len", "--gpus-per-node", "--memory-fraction", "--top", "--lora-rank",
           "--precision", "--model", "--hardware"]


@CLI_BUDGET
@given(st.sampled_from(OPTIONS), st.one_of(st.sampled_from(["nan", "inf", "-1", "0", "1e400", "9" * 30, "", "x"]),
                                           st.text(max_size=12)))
def test_cli_plan_arguments_exit_0_1_or_2_in_one_line(option, value):
    args = ["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "8",
            "--seq-len", "128", option, value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    if result.exit_code == 2:
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
