"""The ``autoplan`` command line: a thin click shell over the planner API.

One module per verb group (``plan``: plan, evaluate, explain; ``presets``: models, hardware; ``launch``;
``validate``; ``profile``; ``alpa``: trace, shard), each holding option parsing and printing only;
the work is done by ``planner.api``, ``planner.emit``, ``planner.validate`` and ``profiles``."""

from __future__ import annotations

import sys

import click


class OneLineErrors(click.Group):
    """click's group, but a usage error (bad choice, missing option, unknown command) prints one
    line, ``error: <what is wrong with which option>``, and exits 2, instead of usage text."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as err:
            click.echo(f"error: {err.format_message()}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            err.show()
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="autoplan")
def main() -> None:
    """autoplan: choose the parallel layout of a transformer training job, and run it.

    \b
    Start with:  autoplan plan --model llama3-70b --hardware h100-sxm-80gb --gpus 64 \\
                   --global-batch 512 --seq-len 8192
    """


# Commands live in their own modules; each is registered here.
# (register-commands: keep one line per module)
from .plan import evaluate_command, explain_command, plan_command  # noqa: E402
from .presets import hardware_command, models_command  # noqa: E402

for _command in (plan_command, evaluate_command, explain_command, models_command, hardware_command):
    main.add_command(_command)
from .profile import profile_command; main.add_command(profile_command)  # noqa: E402
from .launch import launch_command; main.add_command(launch_command)  # noqa: E402
from .alpa import shard_command, trace_command; main.add_command(trace_command); main.add_command(shard_command)  # noqa: E402,E501
from .validate import validate_command; main.add_command(validate_command)  # noqa: E402
