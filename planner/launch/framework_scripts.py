"""Run scripts of the framework jobs: launch.sh (torchrun on this node or, under Slurm, on each) and
slurm.sbatch, for Megatron-LM, Megatron-Bridge, torchtitan and Megatron-DeepSpeed.

Each script reads its framework checkout from one variable (``MEGATRON_LM``, ``MEGATRON_BRIDGE``,
``MEGATRON_DEEPSPEED``; torchtitan runs as the installed module ``torchtitan.train``), names the
job's checkpoint and log directories inside its own directory (``output_words``), and passes extra
arguments through (``"$@"``: data, tokenizer, checkpoints). Synthetic data is the default
and gives way to data the arguments name (``MOCK_DATA_UNLESS_GIVEN``; Megatron-Bridge: a later
``--dataset`` wins over ``--dataset mock``), except for Megatron-DeepSpeed, which has none
(``DATA_REQUIRED``)."""

from __future__ import annotations

import json
import shlex

from .megatron_fields import ARG_FIELDS
from .scripts import job_name
from .slurm import SlurmOptions, sbatch_lines, segment_lines
from .training_settings import DEFAULT_SETTINGS

MOCK_DATA_UNLESS_GIVEN = ('DATA=(--mock-data)\n'
                          'for arg in "$@"; do case "$arg" in --mock-data|--data-path*|--train-data-path*|'
                          '--data-args-path*|--per-split-data-args-path*|--train-weighted-split-paths*) '
                          'DATA=() ;; esac; done')
"""Bash lines that give Megatron's ``pretrain_gpt.py`` synthetic data only when the arguments name
none: ``--mock-data`` takes precedence over ``--data-path`` in Megatron, so a job that always passed
it would train on random tokens whatever data the user gave."""
DATA_REQUIRED = ('case " $* " in *" --data-path"*|*" --train-data-path"*) ;; *) echo "launch.sh: Megatron-DeepSpeed '
                 'has no synthetic data (no --mock-data); pass --data-path PREFIX" >&2; exit 2 ;; esac')
"""A bash line that stops a Megatron-DeepSpeed job given no data: its ``megatron/arguments.py`` (4efb479d)
has no ``--mock-data``, so passing one ends in "unrecognized arguments"."""
_COMMANDS = {
    "megatron": ('source "$HERE/megatron_args.sh"\n' + MOCK_DATA_UNLESS_GIVEN,
                 '"${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" '
                 '"${DATA[@]}" "$@"'),
    "megatron-bridge": ('mapfile -t OVERRIDES < <(grep -v "^#" "$HERE/bridge_overrides.txt")',
                        '"${MEGATRON_BRIDGE:?set MEGATRON_BRIDGE to a Megatron-Bridge checkout}/scripts/training/'
                        'run_recipe.py" --recipe "${RECIPE:?set RECIPE to a pretrain recipe of the model}" '
                        '--dataset mock "${OVERRIDES[@]}" "$@"'),
    "torchtitan": (":", '-m torchtitan.train --job.config_file "$HERE/torchtitan.toml" "$@"'),
    "deepspeed": ('source "$HERE/megatron_deepspeed_args.sh"\n' + DATA_REQUIRED,
                  '"${MEGATRON_DEEPSPEED:?set MEGATRON_DEEPSPEED to a Megatron-DeepSpeed checkout}/pretrain_gpt.py" '
                  '"${MEGATRON_DS_ARGS[@]}" --deepspeed_config "$HERE/deepspeed.json" "$@"'),
}
"""Runtime -> (bash line that loads the exported options, what torchrun runs)."""
TORCHTITAN_CLI_COMMAND = ('source "$HERE/torchtitan_args.sh"\nexport PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"',
                          '-m torchtitan.train "${TORCHTITAN_ARGS[@]}" "$@" "${TORCHTITAN_AC[@]}"')
"""torchtitan 0.3.0 on: its options, the arguments given to launch.sh, then the activation-checkpoint
subcommand, after which tyro would apply any option to the subcommand (``torchtitan_cli``); the job's
directory on the PYTHONPATH for its own config registry, where it has one."""
FRAMEWORK_VARIABLES: dict[str, tuple[str, ...]] = {
    "megatron": ("MEGATRON_LM",), "megatron-bridge": ("MEGATRON_BRIDGE", "RECIPE"), "torchtitan": (),
    "deepspeed": ("MEGATRON_DEEPSPEED",)}
"""The variables each runtime's launch.sh requires (``${VAR:?...}`` in ``_COMMANDS``): where the
framework's checkout is, and for Megatron-Bridge the recipe that gives the architecture."""


CHECKPOINT_DIR = "checkpoints"
"""Where a Megatron-LM, Megatron-Bridge or Megatron-DeepSpeed job saves and resumes, in its job directory."""
TORCHTITAN_DUMP_DIR = "outputs"
"""torchtitan's ``dump_folder`` in the job directory (the name of its default, ``./outputs``), which holds
``checkpoint.folder`` and ``metrics.save_tb_folder`` ("checkpoints will be in
{--job.dump_folder}/{--checkpoint.folder}", ``torchtitan/config/job_config.py`` of v0.2.2)."""


def output_words(runtime: str, *, log_dir: str = DEFAULT_SETTINGS.log_dir, command_line: bool = False) -> str:
    """The words of launch.sh's command that put the job's checkpoints and TensorBoard logs in its own
    directory (``$HERE``), whatever directory launch.sh is started from: Megatron-LM's and
    Megatron-DeepSpeed's ``--save``, ``--load``, ``--tensorboard-dir``; the same Bridge fields as JSON
    values (``ARG_FIELDS``, like ``bridge_overrides.txt``'s); torchtitan's dump folder
    (``--job.dump_folder``, 0.3.0's ``--dump_folder``). launch.sh does not change directory: paths in
    its arguments, and torchtitan's tokenizer and dataset defaults (``./assets/hf/...``, read from its
    checkout), stay relative to where it is started. ``framework_launch_sh`` puts these words before
    launch.sh's arguments, so a ``--save`` of the user's comes later and wins."""
    if runtime == "torchtitan":
        return f"--{'' if command_line else 'job.'}dump_folder \"$HERE\"/{TORCHTITAN_DUMP_DIR}"
    places = {"save": CHECKPOINT_DIR, "load": CHECKPOINT_DIR, "tensorboard_dir": log_dir}
    if runtime == "megatron-bridge":
        return " ".join(f'"{ARG_FIELDS[dest][0]}=\\"$HERE/{name}\\""' for dest, name in places.items())
    return " ".join(f'--{dest.replace("_", "-")} "$HERE"/{shlex.quote(name)}' for dest, name in places.items())


def device_connections(*, ep_comm_overlap: bool, flex_dispatcher: bool, compute_capability: float) -> int:
    """``CUDA_DEVICE_MAX_CONNECTIONS`` for the job: 1, which orders the TP collectives behind their
    GEMMs as Megatron's TP and CP need; with the EP overlap, whose forward and backward streams need
    more (Megatron-LM ``arguments.py``), Megatron-Bridge's values: 32 with a flex dispatcher or on
    Blackwell (compute capability 10 and up), else 8 (``scripts/performance/utils/overrides.py``)."""
    if not ep_comm_overlap:
        return 1
    return 32 if flex_dispatcher or compute_capability >= 10 else 8


def framework_launch_sh(runtime: str, *, nodes: int, gpus_per_node: int, summary: str,
                        max_connections: int = 1, command_line: bool = False,
                        log_dir: str = DEFAULT_SETTINGS.log_dir) -> str:
    """launch.sh: torchrun over NNODES x GPUS_PER_NODE (the plan's world by default), with
    ``CUDA_DEVICE_MAX_CONNECTIONS`` = ``max_connections`` (``device_connections``), checkpoints and
    logs in the job directory (``output_words``, just before launch.sh's own arguments, ``"$@"``);
    ``command_line``: torchtitan configured by its command line (``TORCHTITAN_CLI_COMMAND``)."""
    load, command = TORCHTITAN_CLI_COMMAND if command_line else _COMMANDS[runtime]
    assert command.count('"$@"') == 1, command
    outputs = output_words(runtime, log_dir=log_dir, command_line=command_line)
    command = command.replace('"$@"', f'{outputs} "$@"')
    lines = ["#!/usr/bin/env bash", f"# {runtime} job for: {json.dumps(summary)}",
             "# Checkpoints and logs go in this job's directory, wherever it is started from; paths in its "
             "arguments are read from the current directory.", "set -euo pipefail",
             'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             f'NNODES="${{NNODES:-{nodes}}}"', f'GPUS_PER_NODE="${{GPUS_PER_NODE:-{gpus_per_node}}}"',
             'NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"', 'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
             'MASTER_PORT="${MASTER_PORT:-29500}"', f"export CUDA_DEVICE_MAX_CONNECTIONS={max_connections}", load,
             'torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK" '
             '--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" ' + command]
    return "\n".join(lines) + "\n"


def framework_sbatch(*, nodes: int, gpus_per_node: int, name: str, slurm: SlurmOptions = SlurmOptions(),
                     gpus_per_nvlink_domain: int = 0) -> str:
    """slurm.sbatch: one launch.sh per node, the first node as the rendezvous; the allocation and the
    job directory as ``planner.launch.slurm`` states them, on the plan's rack placement
    (``slurm.segment_lines``). The job name is ``scripts.job_name``'s (letters, digits, '.', '_', '-'):
    a quoted name could hold a newline, which would end the ``#SBATCH`` comment and run the rest of
    the model name as a command."""
    resources = "\n".join([f"#SBATCH --gpus-per-node={gpus_per_node}",
                           *segment_lines(gpus_per_nvlink_domain, gpus_per_node, nodes)])
    lines = ["#!/usr/bin/env bash", "# Submit with: sbatch slurm.sbatch [arguments for launch.sh], from any directory"]
    lines += sbatch_lines(slurm, name=job_name(name), nodes=nodes, resources=resources)
    lines += ['export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
              f"export NNODES={nodes} GPUS_PER_NODE={gpus_per_node}",
              'srun --kill-on-bad-exit=1 bash "$HERE/launch.sh" "$@"']
    return "\n".join(lines) + "\n"
