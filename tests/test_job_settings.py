"""Issue 38: a framework job a user can submit as written. Each carries its training length, learning
rate and schedule, and where checkpoints and logs go (``launch --steps/--lr/--warmup-steps/--min-lr-ratio``,
named in the job's header), and runs the attention kernel the plan costed."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan_base.errors import AutoplanError
from costmodels.layout import Layout
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from framework_args import parse
from planner.cli import main
from planner.launch.frameworks import megatron_deepspeed_args
from planner.launch.megatron_export import megatron_args
from planner.launch.readback import bash_array, bridge_fields
from planner.launch.training_settings import TrainingSettings, require_schedulable

EVALUATE = ["evaluate", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64",
            "--seq-len", "4096", "--dp", "2", "--tp", "2", "--pp", "2", "--zero", "1", "--sequence-parallel"]
SETTINGS = ["--steps", "321", "--lr", "0.0002", "--warmup-steps", "20", "--min-lr-ratio", "0.05"]


def _job(tmp_path: Path, runtime: str, *launch: str) -> Path:
    plan = tmp_path / "plan.json"
    extra = ["--zero", "3"] if runtime == "torchtitan" else []
    assert CliRunner().invoke(main, [*EVALUATE, *extra, "--runtime", runtime, "--out", str(plan)]).exit_code == 0
    result = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job"), *launch])
    assert result.exit_code == 0, result.output
    return tmp_path / "job"


@pytest.mark.parametrize("runtime", ["megatron", "deepspeed"])
def test_megatron_jobs_train_as_the_launch_options_say(tmp_path, runtime):
    job = _job(tmp_path, runtime, *SETTINGS)
    file, array, schema = (("megatron_args.sh", "MEGATRON_ARGS", "megatron-lm@core_v0.19.0") if runtime == "megatron"
                           else ("megatron_deepspeed_args.sh", "MEGATRON_DS_ARGS", "megatron-deepspeed@4efb479d5317"))
    text = (job / file).read_text(encoding="utf-8")
    args = parse(schema, bash_array(text, array))
    assert (args.train_iters, args.lr, args.lr_warmup_iters, args.lr_decay_iters) == (321, 2e-4, 20, 321)
    assert args.min_lr == pytest.approx(1e-5) and args.lr_decay_style == "cosine"
    # where it saves and logs is launch.sh's, in the job directory (test_framework_launch.py)
    assert (args.save, args.load, args.tensorboard_dir) == (None, None, None) and args.save_interval > 0
    assert "321 steps, learning rate 0.0002 after 20 warm-up steps" in text  # named in the header


def test_torchtitan_and_bridge_jobs_train_as_the_launch_options_say(tmp_path):
    text = (_job(tmp_path / "tt", "torchtitan", *SETTINGS) / "torchtitan_args.sh").read_text()  # torchtitan v0.3.0
    tokens = bash_array(text, "TORCHTITAN_ARGS")
    value = lambda option: tokens[tokens.index(option) + 1]  # noqa: E731
    assert (value("--training.steps"), value("--optimizer.param-groups.0.optimizer-kwargs.lr"),
            value("--lr-scheduler.warmup-steps")) == ("321", "0.0002", "20")
    assert value("--lr-scheduler.min-lr-factor") == "0.05" and value("--metrics.save-tb-folder") == "logs"
    fields = bridge_fields(_job(tmp_path / "mb", "megatron-bridge", *SETTINGS))
    assert (fields["train.train_iters"], fields["optimizer.lr"], fields["scheduler.lr_warmup_iters"]) == (321, 2e-4, 20)


def test_deepspeed_json_takes_the_learning_rate(tmp_path):
    ds = json.loads((_job(tmp_path, "deepspeed", "--lr", "0.0005") / "deepspeed.json").read_text())
    assert ds["optimizer"]["params"]["lr"] == 5e-4


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps 0"), (["--lr", "-1"], "--lr -1.0"), (["--min-lr-ratio", "2"], "--min-lr-ratio 2.0"),
])
def test_bad_training_settings_are_one_line_exit_2(tmp_path, args, message):
    plan = tmp_path / "plan.json"
    assert CliRunner().invoke(main, [*EVALUATE, "--out", str(plan)]).exit_code == 0
    result = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job"), *args])
    assert result.exit_code == 2 and message in result.output and not (tmp_path / "job").exists()


@pytest.mark.parametrize("runtime", ["megatron", "deepspeed"])
@pytest.mark.parametrize("args, named", [(["--warmup-steps", "5000"], "--warmup-steps 5000 is not below --steps 1000"),
                                         (["--steps", "100"], "--warmup-steps 100 (its default) is not below --steps 100"),
                                         (["--steps", "50", "--warmup-steps", "50"], "--warmup-steps 50 is not below")])
def test_a_warm_up_megatron_would_stop_on_is_one_line_exit_2(tmp_path, runtime, args, named):
    """Megatron-LM and Megatron-DeepSpeed assert lr_warmup_steps < lr_decay_steps when they build their
    scheduler, and these jobs decay over the whole run (--lr-decay-iters = --steps): launch refuses
    the warm-up before writing anything, naming both options."""
    plan = tmp_path / "plan.json"
    assert CliRunner().invoke(main, [*EVALUATE, "--runtime", runtime, "--out", str(plan)]).exit_code == 0
    result = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job"), *args])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {named}") and "--steps" in line and "optimizer_param_scheduler.py" in line
    assert "Traceback" not in result.output and not (tmp_path / "job").exists()


def test_a_long_warm_up_is_written_where_the_framework_shortens_it_itself(tmp_path):
    """Megatron-Bridge (v0.4.0 on) and torchtitan cap a warm-up longer than the run with a warning and
    train: their jobs are written, with the warm-up at most the run."""
    args = ("--steps", "100", "--warmup-steps", "5000")
    fields = bridge_fields(_job(tmp_path / "mb", "megatron-bridge", *args))
    assert (fields["train.train_iters"], fields["scheduler.lr_warmup_iters"]) == (100, 100)
    tokens = bash_array((_job(tmp_path / "tt", "torchtitan", *args) / "torchtitan_args.sh").read_text(),
                        "TORCHTITAN_ARGS")
    assert tokens[tokens.index("--lr-scheduler.warmup-steps") + 1] == "100"


@pytest.mark.parametrize("warmup, steps", [(0, 1), (99, 100), (100, 100), (5000, 1000), (100, 1000)])
def test_the_refusal_is_megatron_cores_own_scheduler_check(warmup, steps):
    """``require_schedulable`` refuses exactly the warm-ups on which Megatron-Core's
    ``OptimizerParamScheduler`` stops (built as ``get_optimizer_param_scheduler`` builds it from
    --lr-warmup-iters and --lr-decay-iters = --train-iters, both times the global batch)."""
    scheduler = pytest.importorskip("megatron.core.optimizer_param_scheduler")
    batch = 512
    settings = TrainingSettings(steps=steps, warmup_steps=warmup)
    try:
        scheduler.OptimizerParamScheduler(
            types.SimpleNamespace(param_groups=[{}]), init_lr=0.0, max_lr=settings.lr, min_lr=settings.min_lr,
            lr_warmup_steps=warmup * batch, lr_decay_steps=steps * batch, lr_decay_style="cosine",
            start_wd=0.1, end_wd=0.1, wd_incr_steps=steps * batch, wd_incr_style="constant")
        megatron_starts = True
    except AssertionError:
        megatron_starts = False
    for runtime in ("megatron", "deepspeed"):
        try:
            require_schedulable(settings, runtime)
            refused = False
        except AutoplanError:
            refused = True
        assert refused is not megatron_starts
    require_schedulable(settings, "megatron-bridge")  # never refused: the frameworks that cap it
    require_schedulable(settings, "torchtitan")


@pytest.mark.parametrize("attention, megatron_backend, flash_flag", [("fused", "flash", True),
                                                                     ("eager", "unfused", False)])
def test_each_job_runs_the_attention_the_plan_costed(attention, megatron_backend, flash_flag):
    """fused is costed as FlashAttention (no scores in memory): Megatron-LM's --attention-backend flash,
    Megatron-DeepSpeed's --use-flash-attn-v2, without which it runs its unfused core."""
    model = load_model("llama3-8b")
    training = TrainingSpec(global_batch_size=64, seq_len=4096, attention=attention)
    layout = Layout(dp=4, tp=2, pp=1, zero_stage=1, sequence_parallel=True, micro_batch_size=1, num_microbatches=16)
    args, _ = megatron_args(model, training, layout, 4096)
    assert parse("megatron-lm@core_v0.19.0", args).attention_backend == megatron_backend
    ds = parse("megatron-deepspeed@4efb479d5317", megatron_deepspeed_args(model, training, layout))
    assert ds.use_flash_attn_v2 is flash_flag


def test_torchtitan_refuses_eager_attention_at_plan_time():
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8",
                                       "--global-batch", "64", "--seq-len", "4096", "--runtime", "torchtitan",
                                       "--attention", "eager"])
    assert result.exit_code == 2 and "training.attention = eager" in result.output


def test_a_hugging_face_config_directory_names_the_job_by_the_model_not_its_path(tmp_path):
    """A config directory /tmp/x/mistral-nemo named the job 'tmp-x-mistral-nemo' (and torchtitan's flavor
    the path): the jobs take the model's own name."""
    model_dir = tmp_path / "nu" / "mistral-nemo"
    model_dir.mkdir(parents=True)
    model_dir.joinpath("config.json").write_text(
        (Path(__file__).parent / "data" / "hf_configs" / "mistral-nemo-12b.json").read_text())
    plan = tmp_path / "plan.json"
    assert CliRunner().invoke(main, ["evaluate", "--model", str(model_dir), "--hardware", "h100-sxm-80gb", "--gpus",
                                     "16", "--global-batch", "256", "--seq-len", "4096", "--dp", "4", "--tp", "4", "--pp", "1",
                                     "--out", str(plan)]).exit_code == 0
    result = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job"),
                                       "--scheduler", "kubernetes"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --job-name=mistral-nemo\n" in (tmp_path / "job" / "slurm.sbatch").read_text()
    assert "\n  name: mistral-nemo\n" in (tmp_path / "job" / "jobset.yaml").read_text()
