"""The ``autoplan`` command line: a thin click shell over the planner API."""

from __future__ import annotations

import click



@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="autoplan")
def main() -> None:
    """autoplan: choose the parallel layout of a transformer training job, and run it.

    \b
    Start with:  autoplan plan --model llama3-70b --hardware h100-sxm-80gb --gpus 64 \\
                   --global-batch 512 --seq-len 8192
    """


# Commands live in their own modules; each is registered here.
# (register-commands: keep one line per module)
from .cli_plan import evaluate_command, explain_command, hardware_command, models_command, plan_command  # noqa: E402

for _command in (plan_command, evaluate_command, explain_command, models_command, hardware_command):
    main.add_command(_command)
from .cli_profile import profile_command; main.add_command(profile_command)  # noqa: E402
from .cli_launch import launch_command; main.add_command(launch_command)  # noqa: E402
from .cli_alpa import shard_command, trace_command; main.add_command(trace_command); main.add_command(shard_command)  # noqa: E402,E501
from .cli_validate import validate_command; main.add_command(validate_command)  # noqa: E402
