"""``narrowing_conflicts``: when the user's narrowing options leave nothing to search, which option
excludes each value it allows, and by which rule, so the error blames the option (exit 2), not the
GPU count ("nothing fits", exit 1, stays for capacity).

The rules are the search space's own: tp inside one NVLink domain unless ``--allow-cross-node-tp``
and dividing the attention heads (``planner.search.space.mesh_choices``), pp at most the layers, the
ZeRO stages a runtime pipelines (``RuntimeCapabilities.pipelined_zero_stages``), virtual stages
dividing the layers per stage, a micro-batch size dividing the global batch, a MoE dispatcher only
where the model has experts.
"""

from __future__ import annotations

from typing import Callable

from costmodels.capabilities import Narrowing, RuntimeCapabilities
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec

from .runtime_space import flag_name


def _tp_reasons(tp: int, model: ModelSpec, gpus: int, domain: int, cross_node: bool) -> list[str]:
    out = []
    if tp > domain and not cross_node:
        out.append(f"tp {tp} crosses the NVLink domain of {domain} GPUs (--allow-cross-node-tp lets it)")
    if model.num_attention_heads % tp:
        out.append(f"tp {tp} does not divide the {model.num_attention_heads} attention heads")
    if gpus % tp:
        out.append(f"tp {tp} does not divide the {gpus} GPUs")
    return out


def _pp_zero_reasons(narrowing: Narrowing, table: RuntimeCapabilities, model: ModelSpec) -> list[str]:
    """Why every requested pipeline degree is excluded (more stages than layers, or a ZeRO stage the
    runtime does not pipeline); empty when one of them is left to search."""
    stages = narrowing.zero_stages or table.zero_stages
    zero_conflict = not set(stages) & set(table.pipelined_zero_stages)
    if not narrowing.pp or not all(p > model.num_layers or (p > 1 and zero_conflict) for p in narrowing.pp):
        return []
    out = [f"pp {p} is more than the {model.num_layers} layers" for p in narrowing.pp if p > model.num_layers]
    pipelines = [p for p in narrowing.pp if 1 < p <= model.num_layers]
    if pipelines:
        out.append(f"{table.runtime} cannot combine ZeRO stage {','.join(map(str, stages))} with pipelining (pp "
                   f"{','.join(map(str, pipelines))}); it pipelines ZeRO stages "
                   f"{','.join(map(str, table.pipelined_zero_stages))} only")
    return out


def virtual_stage_pipelines(narrowing: Narrowing, gpus: int, num_layers: int) -> tuple[int, ...]:
    """The pipeline degrees above 1 a ``virtual_stages`` narrowing can take: those of ``--pp`` (else
    every degree up to the GPUs and layers) that divide the GPUs."""
    return tuple(p for p in narrowing.pp or range(2, min(gpus, num_layers) + 1) if p > 1 and gpus % p == 0)


def _virtual_reasons(narrowing: Narrowing, model: ModelSpec, gpus: int, name: Callable[[str], str]) -> list[str]:
    """Virtual stages v > 1 are searched where v divides the layers per stage, ceil(layers / pp)
    (``planner.search.space``: an interleaved pipeline's chunks hold whole layers)."""
    wanted = [v for v in narrowing.virtual_stages if v > 1]
    if not wanted or 1 in narrowing.virtual_stages:
        return []
    pps = virtual_stage_pipelines(narrowing, gpus, model.num_layers)
    per_stage = sorted({-(-model.num_layers // p) for p in pps}, reverse=True)
    if any(n % v == 0 for n in per_stage for v in wanted):
        return []
    return [f"{name('virtual_stages')} {','.join(map(str, wanted))}: virtual stages must divide the layers per "
            f"pipeline stage, which are {', '.join(map(str, per_stage)) or 'none'} for {model.num_layers} layers on "
            f"pp {','.join(map(str, pps)) or '(none > 1)'}"]


def narrowing_conflicts(table: RuntimeCapabilities, narrowing: Narrowing, model: ModelSpec,
                        training: TrainingSpec, gpus: int, domain_gpus: int, cross_node_tp: bool,
                        name: Callable[[str], str] = flag_name) -> list[str]:
    """One sentence per narrowing option whose every value a rule of the search excludes, naming the
    option (``name``: ``--tp`` or ``tp=``) and the rule; empty when no option alone is to blame."""
    out = []
    if narrowing.tp:
        reasons = [r for t in narrowing.tp for r in _tp_reasons(t, model, gpus, domain_gpus, cross_node_tp)[:1]]
        if len(reasons) == len(narrowing.tp):
            out.append(f"{name('tp')} {','.join(map(str, narrowing.tp))}: " + "; ".join(reasons))
    pp_zero = _pp_zero_reasons(narrowing, table, model)
    if pp_zero:
        options = " with ".join(f"{name(k)} {','.join(map(str, getattr(narrowing, k)))}"
                                for k in ("zero_stages", "pp") if getattr(narrowing, k))
        out.append(f"{options}: " + "; ".join(pp_zero))
    out += _virtual_reasons(narrowing, model, gpus, name)
    if narrowing.ep and model.moe is None and 1 not in narrowing.ep:
        out.append(f"{name('ep')} {','.join(map(str, narrowing.ep))}: {model.name} is dense, with no experts to "
                   "spread over an expert-parallel group (ep 1)")
    if narrowing.moe_dispatchers and model.moe is None and "alltoall" not in narrowing.moe_dispatchers:
        out.append(f"{name('moe_dispatchers')} {','.join(narrowing.moe_dispatchers)}: {model.name} is dense, with no "
                   "experts to dispatch tokens to (its layouts carry the default, alltoall)")
    if narrowing.micro_batch_sizes and all(training.global_batch_size % b for b in narrowing.micro_batch_sizes):
        out.append(f"{name('micro_batch_sizes')} {','.join(map(str, narrowing.micro_batch_sizes))}: none divides "
                   f"the global batch {training.global_batch_size}")
    return out
