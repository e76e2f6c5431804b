"""Build an exported torchtitan job the way torchtitan's trainer starts it, on CPU, in its own process:
``python tests/torchtitan_build.py JOB_DIR WORLD_SIZE [JOB_DIR WORLD_SIZE ...]`` prints one JSON list,
an entry per job.

1. torchtitan's ``ConfigManager`` parses ``JOB_DIR/torchtitan.toml`` into its ``JobConfig``;
2. ``ParallelDims`` of the parsed degrees builds its device mesh on a fake process group of
   ``WORLD_SIZE`` ranks (``torch.testing._internal.distributed.fake_pg``; no communication);
3. torchtitan's llama3 ``Transformer`` of the parsed flavor is built on the meta device and split into
   pipeline stages by torchtitan's own ``pipeline_module_split`` for every pipeline rank, with the
   module names the job gives (``module_fqns_per_model_part``) or torchtitan's
   ``generate_llm_fqn_per_model_part`` of ``pipeline_parallel_layers_per_stage`` (as ``pipeline_llm``).

``pipeline_module_split`` deep-copies the whole model for each stage; here it copies the top level and
the layer container only (``_top_level_copy``: the split changes nothing deeper), which keeps what
each stage holds and saves a minute on Llama 3 405B's 64 stages.

Printed: the parsed config's sections, whether FSDP is on, and the modules each stage holds.
Modules the config, mesh and model code import but never use on this path (the tokenizer and dataset
stack, the metrics writers, Triton kernels of the MoE and float8 code) are absent from the test
environment and replaced by empty stand-ins before torchtitan is imported; torch's own optional
imports are settled first so torch never sees a stand-in.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import types

STAND_INS = ("tokenizers", "datasets", "datasets.distributed", "triton", "triton.language", "torchdata",
             "torchdata.stateful_dataloader", "torch.utils.tensorboard", "wandb")
"""Imported by torchtitan's modules on this path, used only when training."""


class _StandIn(types.ModuleType):
    """An absent module: attributes are stand-ins too (classes where capitalised, so they subclass)."""

    __path__: list[str] = []
    __version__ = "0.0.0"

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            return type(name, (), {"__init__": lambda self, *a, **k: None})
        return _StandIn(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) else _StandIn(self.__name__ + "()")


def _prepare() -> None:
    import torch._dynamo  # noqa: F401  torch's own optional imports (triton) settle before the stand-ins
    import torch._inductor.codecache  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401

    stood_in: set[str] = set()
    for name in STAND_INS:
        # torch.utils.tensorboard is torch's, but refuses to import without the tensorboard package
        top = "tensorboard" if name == "torch.utils.tensorboard" else name.split(".")[0]
        if top in stood_in or (top not in sys.modules and importlib.util.find_spec(top) is None):
            sys.modules[name] = _StandIn(name)
            stood_in.add(top)


class _PipelineRank:
    """The pp mesh as pipeline rank ``rank`` sees it (``pipeline_module_split`` asks only these)."""

    def __init__(self, mesh, rank: int):
        self.mesh, self.rank = mesh, rank

    def get_local_rank(self) -> int:
        return self.rank

    def size(self) -> int:
        return self.mesh.size()

    def get_group(self, name=None):
        return self.mesh.get_group()


def _top_level_copy(model):
    """A copy of ``model`` whose top-level children and layer container are its own, the layers
    shared: all ``pipeline_module_split`` changes on its copy (it deletes layers from the container and
    sets other children to None), at a fraction of ``copy.deepcopy``'s cost for a 126-layer model."""
    import copy

    import torch

    clone = copy.copy(model)
    clone._modules = dict(model._modules)
    for name, child in model._modules.items():
        if isinstance(child, torch.nn.ModuleDict):
            clone._modules[name] = torch.nn.ModuleDict(child.items())
        elif isinstance(child, torch.nn.ModuleList):
            clone._modules[name] = torch.nn.ModuleList(child)
    return clone


def _modules(chunk) -> list[str]:
    import torch

    out = []
    for name, module in chunk.named_children():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            keys = module.keys() if isinstance(module, torch.nn.ModuleDict) else range(len(module))
            out += [f"{name}.{k}" for k in keys]
        elif module is not None:
            out.append(name)
    return out


def build(job: str, world_size: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torchtitan.config import ConfigManager
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torchtitan.distributed.parallel_dims import ParallelDims
    import torchtitan.distributed.pipeline_parallel as pipeline_parallel
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part, pipeline_module_split
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.model import Transformer

    pipeline_parallel.copy = types.SimpleNamespace(deepcopy=_top_level_copy)
    config = ConfigManager().parse_args(["--job.config_file", f"{job}/torchtitan.toml"])
    p = config.parallelism
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    parallel_dims_module.device_type = "cpu"  # the mesh is the same on any device; no GPU here
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=world_size)
    mesh = dims.build_mesh()
    stages: dict[int, list[str]] = {}
    if dims.pp_enabled:
        args = llama3_args[config.model.flavor]
        with torch.device("meta"):
            model = Transformer(args)
        names = p.module_fqns_per_model_part
        if names is None:  # pipeline_llm: layers per stage, embedding and head weighed as layers
            first, last = p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers
            count = math.ceil((args.n_layers + first + last) / p.pipeline_parallel_layers_per_stage)
            names = generate_llm_fqn_per_model_part(count, args.n_layers, first, last)
        for rank in range(p.pipeline_parallel_degree):
            built, chunks = pipeline_module_split(model, _PipelineRank(dims.get_mesh("pp"), rank),
                                                  p.pipeline_parallel_schedule, torch.device("meta"), names)
            for stage, chunk in zip(built, chunks):
                stages[stage.stage_index] = _modules(chunk)
    dist.destroy_process_group()
    sections = {name: dataclasses.asdict(getattr(config, name)) for name in
                ("model", "training", "parallelism", "activation_checkpoint", "compile", "checkpoint", "quantize")}
    return {"sections": sections, "fsdp_enabled": dims.fsdp_enabled, "mesh_size": mesh.size(),
            "stages": [stages[i] for i in sorted(stages)]}


if __name__ == "__main__":
    _prepare()
    pairs = sys.argv[1:]
    print(json.dumps([build(job, int(world)) for job, world in zip(pairs[::2], pairs[1::2])]))
