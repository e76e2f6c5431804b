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

TIME_FORMS = ("minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes",
              "days-hours:minutes:seconds")
"""``sbatch --time``'s forms, in its manual's words (slurm.schedmd.com ``sbatch``)."""
_TIME = re.compile(r"(?:([0-9]+)-)?([0-9]+(?::[0-9]+){0,2})")
"""Days and the clock fields of one of ``TIME_FORMS`` (ASCII digits only, matched whole)."""
_UNIT_LIMITS = {"hours": 23, "minutes": 59, "seconds": 59}
"""The largest value of a field that follows another. Slurm checks only the characters and adds the
fields up (``time_str2secs`` in SchedMD/slurm ``src/common/parse_time.c`` at 01cec7fa), so it would
take ``99:99:99`` as 100:40:39; a field past its unit is refused here instead."""
_NAME = re.compile(r"[A-Za-z0-9._,-]+")


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
        problem = time_limit_problem(self.time)
        if problem:
            raise AutoplanError(f"--slurm-time {self.time!r}: {problem}; expected one of sbatch's forms "
                                f"{', '.join(TIME_FORMS)} (e.g. 24:00:00 or 2-00:00:00)")
        for flag, value in (("--slurm-partition", self.partition), ("--slurm-account", self.account)):
            if value is not None and not _NAME.fullmatch(value):  # ``match`` with ``$`` lets a final newline through
                raise AutoplanError(f"{flag} {value!r}: expected letters, digits, '.', '_', ',' or '-'")


def time_limit_problem(text: str) -> str | None:
    """What is wrong with ``text`` as an ``sbatch --time`` (``TIME_FORMS``), or None. The first field
    is any number; hours after days are 0-23, minutes and seconds after another field 0-59."""
    match = _TIME.fullmatch(text)
    if match is None:
        return "not a time limit"
    days, clock = match.groups()
    values = [int(field) for field in clock.split(":")]
    units = ("hours", "minutes", "seconds") if days is not None else \
        {1: ("minutes",), 2: ("minutes", "seconds"), 3: ("hours", "minutes", "seconds")}[len(values)]
    following = list(zip(units, values))[0 if days is not None else 1:]
    for unit, value in following:
        if value > _UNIT_LIMITS[unit]:
            return f"{unit} {value} is out of range (0-{_UNIT_LIMITS[unit]} after another field)"
    return None


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


def segment_lines(gpus_per_nvlink_domain: int, gpus_per_node: int, nodes: int) -> list[str]:
    """``#SBATCH`` lines that give a plan's rack placement (``Layout.gpus_per_nvlink_domain``) on
    Slurm's topology/block plugin: ``--segment=K`` allocates the job in segments of K nodes, each in
    one block (an NVLink rack; ``sbatch --segment``), which is how Megatron-Bridge's launcher places
    its GB200 jobs (``scripts/performance/utils/executors.py``, ``segment=``). Slurm needs the node
    count to be a multiple of K; where it is not, a comment says what to ask for. None for 0."""
    if not gpus_per_nvlink_domain:
        return []
    segment = gpus_per_nvlink_domain // gpus_per_node
    if nodes % segment == 0:
        return [f"#SBATCH --segment={segment}"]
    return [f"# costed with {gpus_per_nvlink_domain} GPUs ({segment} nodes) of each NVLink domain; {nodes} nodes is "
            f"not a multiple of {segment}, so allocate the racks by hand"]


def submit_line(job_dir: str) -> str:
    """The command that submits a job directory's ``slurm.sbatch``, as ``launch`` prints it."""
    return f"sbatch {shlex.quote(job_dir.rstrip('/') + '/slurm.sbatch')}"
