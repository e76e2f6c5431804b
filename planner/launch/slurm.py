"""What every job's ``slurm.sbatch`` asks Slurm for, and how it finds its job directory.

``sbatch`` runs a spooled copy of the script, so the script's own path is not the job directory, and
``SLURM_SUBMIT_DIR`` is wherever ``sbatch`` was typed. The directory is read back from Slurm's record
of the submitted script (``scontrol show job``: ``Command=`` is the script's path as submitted,
made absolute), so the job runs whatever directory it was submitted from and wherever the directory
was moved before; ``AUTOPLAN_JOB_DIR`` overrides it. Options are ``sbatch``'s own (slurm.schedmd.com
``sbatch``: ``--time``, ``--exclusive``, ``--partition``, ``--account``, ``--gpus-per-node``;
``srun --kill-on-bad-exit=1`` ends every task when one fails, rather than leaving the others waiting
in a collective until the time limit).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from autoplan_base.errors import AutoplanError

_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
"""sbatch --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
_NAME = re.compile(r"^[A-Za-z0-9._,-]+$")


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmOptions:
    """The allocation ``slurm.sbatch`` asks for (``launch --slurm-*``)."""

    time: str = "24:00:00"
    """Wall-clock limit (``#SBATCH --time``); a job without one gets the partition's default, often
    the maximum, and waits behind shorter jobs for it."""
    exclusive: bool = True
    """Whole nodes (``#SBATCH --exclusive``): the plan assumes every GPU and NIC of a node is the job's."""
    partition: str | None = None
    """``#SBATCH --partition`` (None: the cluster's default)."""
    account: str | None = None
    """``#SBATCH --account`` (None: the user's default)."""

    def __post_init__(self) -> None:
        if not _TIME.match(self.time):
            raise AutoplanError(f"--slurm-time {self.time!r}: expected minutes, HH:MM:SS or D-HH:MM:SS")
        for flag, value in (("--slurm-partition", self.partition), ("--slurm-account", self.account)):
            if value is not None and not _NAME.match(value):
                raise AutoplanError(f"{flag} {value!r}: expected letters, digits, '.', '_', ',' or '-'")


def sbatch_lines(options: SlurmOptions, *, name: str, nodes: int, resources: str) -> list[str]:
    """The ``#SBATCH`` lines, then the line that sets ``HERE`` to the job directory."""
    lines = [f"#SBATCH --job-name={name}", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", resources,
             f"#SBATCH --time={options.time}"]
    lines += ["#SBATCH --exclusive"] if options.exclusive else []
    lines += [f"#SBATCH --partition={options.partition}"] if options.partition else []
    lines += [f"#SBATCH --account={options.account}"] if options.account else []
    return lines + ["set -euo pipefail", JOB_DIR_LINE, JOB_DIR_CHECK]


JOB_DIR_LINE = ('HERE="${AUTOPLAN_JOB_DIR:-$(dirname "$(scontrol show job "$SLURM_JOB_ID" '
                '| sed -n "s/^ *Command=//p" | head -n 1)")}"')
"""The job directory: Slurm's record of the submitted script's path, or ``AUTOPLAN_JOB_DIR``."""
JOB_DIR_CHECK = ('[ -f "$HERE/launch.sh" ] || { echo "slurm.sbatch: no launch.sh in $HERE; set AUTOPLAN_JOB_DIR '
                 'to the job directory" >&2; exit 2; }')


def submit_line(job_dir: str) -> str:
    """The command that submits a job directory's ``slurm.sbatch``, as ``launch`` prints it."""
    return f"sbatch {shlex.quote(job_dir.rstrip('/') + '/slurm.sbatch')}"
