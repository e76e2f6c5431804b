"""A user's own ``nn.Module`` as the model of a job (plan field ``inputs.module = "pkg.mod:factory"``).

The contract a model meets to be trained by the generated job (docs/launch.md, "User models"):

1. ``factory()`` takes no arguments, returns an ``nn.Module`` and works under
   ``with torch.device("meta")`` (the job builds it there: no weights are allocated before the
   plan has split them). The module is importable where the job runs (``PYTHONPATH``).
2. ``forward(tokens)`` takes token ids, an int64 tensor [B, S] with values in [0, V), and returns
   logits [B, S, V]; V is read from the output of one forward pass on the meta device.
3. No buffers: after ``to_empty`` a buffer would hold garbage, and the job cannot know its value
   (compute such tensors in ``forward``, as ``model.py`` does for rotary angles).
4. No parameter shared between modules (tied weights) when the plan splits parameters.

Parameters are initialised by the job, by name and independently of the layout
(``init.py``: biases 0, weights of modules named ``*norm*`` 1, others N(0, 0.02)); the factory's
own initialisation is not used. The layout the job applies to a user model: data parallel (any
ZeRO stage) and the plan's ``tp_plan``; no pipeline stages, no recomputation (``layout_problems``).
Importing this module does not import torch (``autoplan launch`` checks plans with it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from autoplan_base.errors import AutoplanError

if TYPE_CHECKING:
    from torch import nn


def layout_problems(layout, *, has_tp_plan: bool) -> list[str]:
    """Parts of ``layout`` (a ``Layout``) the job cannot apply to a user model, one sentence each."""
    problems = []
    if layout.pp > 1:
        problems.append(f"layout.pp = {layout.pp}: a user model (inputs.module) has no known layer sequence to "
                        "cut into pipeline stages; re-plan with --pp 1")
    if layout.recompute != "none":
        problems.append(f"layout.recompute = {layout.recompute}: the job knows no blocks of a user model "
                        "(inputs.module) to recompute; re-plan with --recompute none")
    if layout.cp > 1:
        problems.append(f"layout.cp = {layout.cp}: the job knows no attention modules of a user model "
                        "(inputs.module) to split the sequence over; re-plan with --cp 1")
    if layout.ep > 1:
        problems.append(f"layout.ep = {layout.ep}: the job knows no experts of a user model (inputs.module); "
                        "re-plan with --ep 1")
    if layout.tp > 1 and not has_tp_plan:
        problems.append(f"layout.tp = {layout.tp}: a user model (inputs.module) needs a tensor-parallel plan; "
                        f"attach one with 'autoplan shard --module ... --tp {layout.tp} --attach PLAN --out PLAN'")
    return problems


def load_factory(path: str, field: str = "--module"):
    """Import ``pkg.mod:factory`` and return the callable; bad paths are one-line errors naming ``field``."""
    if ":" not in path:
        raise AutoplanError(f"{field} {path!r}: expected pkg.mod:factory")
    mod_name, attr = path.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as err:  # noqa: BLE001 - any import failure is the user's module
        raise AutoplanError(f"{field} {path}: cannot import {mod_name} ({type(err).__name__}: {err}); "
                            f"is its directory on PYTHONPATH?") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise AutoplanError(f"{field} {path}: {mod_name} has no callable {attr!r}")
    return factory


def build_on_meta(path: str, field: str = "--module") -> nn.Module:
    """Call the factory under the meta device (no weights allocated)."""
    import torch

    factory = load_factory(path, field)
    try:
        with torch.device("meta"):
            module = factory()
    except Exception as err:  # noqa: BLE001
        raise AutoplanError(f"{field} {path}: the factory raised {type(err).__name__}: {err}") from None
    if not isinstance(module, torch.nn.Module):
        raise AutoplanError(f"{field} {path}: the factory returned {type(module).__name__}, not an nn.Module")
    return module.to(device="meta")


def contract_problems(module: nn.Module, *, splits_params: bool) -> list[str]:
    """What keeps ``module`` from being trained by the job (rules 3 and 4 of the contract)."""
    problems = []
    buffers = [name for name, _ in module.named_buffers()]
    if buffers:
        problems.append(f"the model registers buffers ({', '.join(buffers[:3])}{', ...' if len(buffers) > 3 else ''}),"
                        " which the job cannot initialise after building on the meta device; compute them in forward")
    shared = len(list(module.named_parameters(remove_duplicate=False))) - len(list(module.named_parameters()))
    if shared and splits_params:
        problems.append(f"the model shares {shared} parameter(s) between modules (tied weights), which tensor "
                        "parallelism cannot split consistently; untie them or plan with tp 1")
    return problems


def vocab_size(module: nn.Module, seq_len: int, field: str = "inputs.module") -> int:
    """V of the logits [B, S, V] the module returns for tokens [1, seq_len] (one meta forward pass)."""
    import torch

    tokens = torch.zeros((1, seq_len), dtype=torch.long, device="meta")
    try:
        with torch.no_grad():
            out = module.to(device="meta")(tokens)
    except Exception as err:  # noqa: BLE001 - the user's forward
        raise AutoplanError(f"{field}: forward(tokens [1, {seq_len}]) raised {type(err).__name__}: {err}") from None
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
    if shape is None or len(shape) != 3 or shape[:2] != (1, seq_len) or not out.is_floating_point():
        raise AutoplanError(f"{field}: forward(tokens [1, {seq_len}]) must return float logits [1, {seq_len}, V], "
                            f"got {shape if shape is not None else type(out).__name__}")
    return int(shape[-1])


def build_user_model(path: str, *, seq_len: int, splits_params: bool) -> tuple[nn.Module, int]:
    """(module on the meta device, vocabulary size) for ``inputs.module``; contract violations raise."""
    module = build_on_meta(path, "inputs.module")
    problems = contract_problems(module, splits_params=splits_params)
    if problems:
        raise AutoplanError(f"inputs.module {path}: {problems[0]}")
    return module, vocab_size(module, seq_len)
