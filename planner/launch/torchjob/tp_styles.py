"""Apply a ``tp_plan`` dict ({module fqn: style}) with PyTorch's ``parallelize_module``.

The plans come from the intra-operator ILP (``planner/alpa/tp_plan.py``, ``autoplan shard``);
this module is part of the runtime package, so a generated job applies them by itself.
Grammar of a style: ``colwise`` | ``rowwise`` | ``sequence_parallel`` |
``prepare_input`` | ``replicate``, optionally followed by ``;input=L`` and ``;output=L`` with L one of
``replicate``, ``partial``, ``shard(d)``. torch is imported inside the functions.
"""

from __future__ import annotations

from autoplan_base.errors import AutoplanError

STYLES = ("colwise", "rowwise", "sequence_parallel", "prepare_input", "replicate")


def parse_style(value: str) -> tuple[str, dict[str, str]]:
    """``"colwise;input=shard(1)"`` -> ("colwise", {"input": "shard(1)"})."""
    head, *rest = value.split(";")
    if head not in STYLES:
        raise AutoplanError(f"tp_plan: unknown style {head!r}; use one of {', '.join(STYLES)}")
    layouts = {}
    for part in rest:
        key, _, layout = part.partition("=")
        if key not in ("input", "output") or not layout:
            raise AutoplanError(f"tp_plan: bad layout {part!r} in {value!r}; expected input=L or output=L")
        layouts[key] = layout
    return head, layouts


def _placement(text: str):
    from torch.distributed.tensor import Partial, Replicate, Shard

    if text == "replicate":
        return Replicate()
    if text == "partial":
        return Partial()
    if text.startswith("shard(") and text.endswith(")"):
        return Shard(int(text[6:-1]))
    raise AutoplanError(f"tp_plan: bad layout {text!r}; use replicate, partial or shard(d)")


def parallel_styles(module, tp_plan: dict[str, str], *, skip_missing: bool = False) -> dict:
    """{fqn: ParallelStyle} for the entries that split something (``replicate`` is left out).

    ``skip_missing`` drops entries for modules this part does not hold (a pipeline stage)."""
    from torch import nn
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    styles = {}
    present = {name for name, _ in module.named_modules()}
    for fqn, value in sorted(tp_plan.items()):
        head, layouts = parse_style(value)
        if head == "replicate" or (skip_missing and fqn not in present):
            continue
        if fqn not in present:
            raise AutoplanError(f"tp_plan: the model has no module {fqn!r}")
        if head == "sequence_parallel":
            styles[fqn] = SequenceParallel(use_local_output=True)
            continue
        if head == "prepare_input":
            styles[fqn] = PrepareModuleInput(input_layouts=(_placement(layouts.get("input", "replicate")),),
                                             desired_input_layouts=(Replicate(),), use_local_output=True)
            continue
        kwargs = {f"{k}_layouts": _placement(v) for k, v in layouts.items()}
        target = module.get_submodule(fqn)
        if head == "rowwise" and isinstance(target, nn.Embedding):
            kwargs.setdefault("input_layouts", Replicate())
        styles[fqn] = (ColwiseParallel if head == "colwise" else RowwiseParallel)(**kwargs)
    return styles


def resolve_names(module, tp_plan: dict[str, str]) -> dict[str, str]:
    """The plan with its (unwrapped-model) names mapped onto ``module``'s own, which may hold
    recomputation wrappers (``layers.0._checkpoint_wrapped_module.attention``); the style goes to
    the wrapped module itself. Names ``module`` does not hold are kept as they are."""
    from .init import canonical_name

    actual = {}
    for name, _ in module.named_modules():
        actual[canonical_name(name + ".")[:-1]] = name  # a wrapped module is listed after its wrapper
    return {actual.get(fqn, fqn): style for fqn, style in tp_plan.items()}


def apply_tp_plan(module, tp_mesh, tp_plan: dict[str, str], *, skip_missing: bool = False):
    """``parallelize_module(module, tp_mesh, styles)``; returns the module (changed in place).

    Plan names are those of the unwrapped model (as ``autoplan shard`` writes them); recomputation
    wrappers already around blocks are looked through (``resolve_names``)."""
    from torch.distributed.tensor.parallel import parallelize_module

    styles = parallel_styles(module, resolve_names(module, tp_plan), skip_missing=skip_missing)
    if styles:
        parallelize_module(module, tp_mesh, styles)
    return module
