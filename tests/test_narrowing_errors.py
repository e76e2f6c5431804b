"""Issue 38: when the user's narrowing options leave nothing to search, the error names the option and
the rule that excludes its values (exit 2; the API raises ``NarrowingError``), apart from "nothing
fits" (exit 1; the API's ``best is None`` with ``no_fit``), which stays for capacity."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from planner import api
from planner.cli import main
from planner.search.runtime_space import NarrowingError

JOB = dict(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=512, seq_len=8192)
ARGV = ["--model", "llama3-70b", "--hardware", "h100-sxm-80gb", "--gpus", "64", "--global-batch", "512",
        "--seq-len", "8192"]


@pytest.mark.parametrize("options, keywords, says", [
    (["--tp", "16"], dict(tp=[16]), "crosses the NVLink domain of 8 GPUs"),
    (["--zero-stages", "3", "--pp", "4"], dict(zero_stages=[3], pp=[4]),
     "megatron cannot combine ZeRO stage 3 with pipelining"),
    (["--runtime", "deepspeed", "--zero-stages", "2", "--pp", "2"], dict(runtime="deepspeed", zero_stages=[2], pp=[2]),
     "deepspeed cannot combine ZeRO stage 2 with pipelining"),
])
def test_a_narrowing_that_excludes_everything_is_bad_input_naming_the_option(options, keywords, says):
    result = CliRunner().invoke(main, ["plan", *ARGV, *options])
    assert result.exit_code == 2, result.output
    line = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and says in line[0] and "change --gpus" not in line[0]
    narrowed = [o for o in options if o.startswith("--") and o != "--runtime"]
    assert all(o in line[0] for o in narrowed)
    with pytest.raises(NarrowingError, match=says) as raised:  # the API: a distinct error, naming tp= etc.
        api.plan(**JOB, **keywords)
    assert all(f"{k}=" in str(raised.value) for k in keywords if k != "runtime")


def test_capacity_is_still_nothing_fits():
    report = api.plan(model="llama3-405b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    assert report.best is None and report.no_fit is not None
    assert report.no_fit.smallest_fitting_gpus is not None
    # the count found needs the optimizer states in CPU memory, and the reason says so
    assert report.no_fit.fitting_layout.optimizer_offload and "offloaded to CPU memory" in report.no_fit.reason
