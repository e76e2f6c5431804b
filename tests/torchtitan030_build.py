"""Build an exported torchtitan 0.3.0 job the way its trainer starts it, on CPU, in its own process:
``python tests/torchtitan030_build.py JOB_DIR WORLD_SIZE [JOB_DIR WORLD_SIZE ...]`` prints one JSON list,
an entry per job. torchtitan 0.3.0 is imported from ``TORCHTITAN_030`` (``scripts/setup.sh`` installs it
there, beside the 0.2.2 that ``tests/torchtitan_build.py`` reads).

1. torchtitan's ``ConfigManager`` parses the command line of ``JOB_DIR/torchtitan_args.sh``
   (``--module``/``--config`` of a registered config, then the layout's overrides) into its
   ``Trainer.Config``, whose model spec is the registered config's;
2. ``ParallelDims.from_config`` of the parsed parallelism builds its device mesh on a fake process
   group of ``WORLD_SIZE`` ranks (``torch.testing._internal.distributed.fake_pg``; no communication);
3. the model spec's model is built on the meta device and split into pipeline stages for every
   pipeline rank by torchtitan's own ``_pipeline_module_split``, with the module names the job gives
   (``module_fqns_per_model_part``) or those ``pipeline_llm`` derives (``_get_pipeline_metadata``,
   ``_generate_llm_fqn_per_model_part``).

Printed: the parsed config's sections, whether FSDP is on, and the modules each stage holds.
What torchtitan imports on this path but never runs is stood in as in ``torchtitan_build.py``: among it
Triton, which ``torchtitan.models.llama3`` reaches through ``models/common/moe.py`` ->
``token_dispatcher.py`` -> ``distributed/minimal_async_ep/kernels.py`` (``import triton``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, os.environ["TORCHTITAN_030"])
sys.path.insert(1, str(Path(__file__).parent))
sys.path.insert(2, str(Path(__file__).parents[1]))

from torchtitan_build import _modules, _PipelineRank, _prepare, _top_level_copy  # noqa: E402

from planner.launch.readback import bash_array  # noqa: E402

SECTIONS = ("training", "parallelism", "compile", "checkpoint", "lr_scheduler", "metrics")
"""Sections of ``Trainer.Config`` printed as parsed."""


def job_command(job: str) -> list[str]:
    """What launch.sh passes to ``torchtitan.train``: the options, then the activation-checkpoint
    subcommand (tyro applies options to the subcommand before them, so it comes last)."""
    text = Path(job, "torchtitan_args.sh").read_text(encoding="utf-8")
    return bash_array(text, "TORCHTITAN_ARGS") + bash_array(text, "TORCHTITAN_AC")


def _stages(config, dims) -> list[list[str]]:
    import torch

    import torchtitan.distributed.pipeline_parallel as pipeline_parallel
    from torchtitan.distributed.pipeline_parallel import (_generate_llm_fqn_per_model_part, _get_pipeline_metadata,
                                                          _pipeline_module_split)

    pipeline_parallel.copy = types.SimpleNamespace(deepcopy=_top_level_copy)
    p, model_config = config.parallelism, config.model_spec.model
    with torch.device("meta"):
        model = model_config.build()
    names = p.module_fqns_per_model_part
    if names is None:  # pipeline_llm's own split
        names = _generate_llm_fqn_per_model_part(*_get_pipeline_metadata(dims, p, model_config))
    stages: dict[int, list[str]] = {}
    for rank in range(p.pipeline_parallel_degree):
        built, chunks = _pipeline_module_split(model, _PipelineRank(dims.get_mesh("pp"), rank),
                                               p.pipeline_parallel_schedule, torch.device("meta"), names)
        for stage, chunk in zip(built, chunks):
            stages[stage.stage_index] = _modules(chunk)
    return [stages[i] for i in sorted(stages)]


def build(job: str, world_size: int) -> dict:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    sys.path.insert(0, job)  # the job's own config registry, if it has one (launch.sh's PYTHONPATH)
    sys.modules.pop("torchtitan_job", None)
    config = ConfigManager().parse_args(job_command(job))
    sys.path.remove(job)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    dims = ParallelDims.from_config(config.parallelism, world_size)
    mesh = dims.build_mesh()
    stages = _stages(config, dims) if dims.pp_enabled else []
    dist.destroy_process_group()
    sections = {name: dataclasses.asdict(getattr(config, name)) for name in SECTIONS}
    ac = config.activation_checkpoint
    sections["activation_checkpoint"] = {"mode": type(ac).__qualname__.split(".")[0] if ac else None}
    sections["model"] = {"name": config.model_spec.name, "flavor": config.model_spec.flavor,
                         "num_layers": len(config.model_spec.model.layers)}
    return {"sections": sections, "fsdp_enabled": dims.fsdp_enabled, "mesh_size": mesh.size(), "stages": stages}


if __name__ == "__main__":
    _prepare()
    pairs = sys.argv[1:]
    print(json.dumps([build(job, int(world)) for job, world in zip(pairs[::2], pairs[1::2])]))
