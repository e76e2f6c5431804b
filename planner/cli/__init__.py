"""The ``autoplan`` command line: a thin click shell over the planner API.

One module per verb group (``plan``: plan, evaluate, explain; ``presets``: models, hardware; ``launch``;
``validate``; ``calibrate``; ``profile``; ``alpa``: trace, shard), each holding option parsing and
printing only; the work is done by ``planner.api``, ``planner.launch``, ``planner.validate``,
``planner.calibrate`` and ``profiles``."""

from __future__ import annotations

import json
import sys
import traceback

import click

from autoplan_base.errors import AutoplanError, command_line_wording

from .common import EXIT_INTERNAL, EXIT_USAGE, one_line

EXIT_INTERRUPTED = 130


class OneLineErrors(click.Group):
    """click's group with autoplan's exit codes, applied once here for every command:

    \b
    0  success (and bare ``autoplan``, which prints this help);
    1  the request is valid but no layout fits (the closest miss is printed);
    2  bad usage or bad input: one line on stderr naming the option or field;
    3  an internal error (a bug): one line; ``autoplan --debug ...`` shows the traceback.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        args = list(sys.argv[1:] if args is None else args)
        debug = _take_debug(args)
        if not args:
            with self.make_context(prog_name or "autoplan", [], resilient_parsing=True) as ctx:
                click.echo(ctx.get_help())
            sys.exit(0)
        for arg in args:
            if "\x00" in arg:  # no path or name holds one; click's Path type would raise ValueError
                click.echo(f"error: argument {json.dumps(arg)[:80]} contains a NUL byte", err=True)
                sys.exit(EXIT_USAGE)
        try:
            with command_line_wording():
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as err:  # usage errors, bad option values, unreadable click.File
            click.echo(f"error: {one_line(err.format_message())}", err=True)
            sys.exit(EXIT_USAGE)
        except (click.Abort, KeyboardInterrupt):
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except SystemExit:
            raise
        except AutoplanError as err:  # bad input that escaped a command's own handler
            click.echo(f"error: {one_line(str(err))}", err=True)
            sys.exit(EXIT_USAGE)
        except BaseException as err:  # a bug: say so in one line, exit 3 (1 means "nothing fits")
            if debug:
                traceback.print_exc()
            what = one_line(f"{type(err).__name__}: {err}")[:300]
            click.echo(f"internal error: {what}; rerun with --debug for the traceback", err=True)
            sys.exit(EXIT_INTERNAL)
        sys.exit(code if isinstance(code, int) else 0)


def _take_debug(args: list[str]) -> bool:
    """Remove ``--debug`` from the global options (those before the command name)."""
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            return False
        if arg == "--debug":
            del args[i]
            return True
    return False


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="autoplan")
@click.option("--debug", is_flag=True, help="On an internal error (exit 3), print the full traceback.")
def main(debug: bool) -> None:
    """autoplan: choose the parallel layout of a transformer training job, and run it.

    \b
    Start with:  autoplan plan --model llama3-70b --hardware h100-sxm-80gb --gpus 64 \\
                   --global-batch 512 --seq-len 8192

    \b
    Exit codes: 0 success; 1 valid request, but no layout fits (the closest miss is printed);
    2 bad usage or input (one line on stderr naming the option or field);
    3 internal error, a bug (one line; rerun with --debug for the traceback); 130 interrupted.
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
from .calibrate import calibrate_command; main.add_command(calibrate_command)  # noqa: E402
