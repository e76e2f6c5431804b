"""Exact tensor bytes of one rank's training step, by component (imports torch; used under torchrun
and in the fake-tensor dry run alike).

- Model states: a census of the storages behind parameters (the optimizer's local shards, and
  apart from them the modules' registered parameters and FSDP2's unsharded copies), their
  gradients, and the optimizer states, taken at sample points through the step (every saved tensor packed or
  unpacked, each loss, before and after the optimizer step). Each storage counts once.
- Activations: the storages saved for backward, counted with ``torch.autograd.graph.
  saved_tensors_hooks`` and released through a weak reference when autograd frees them, plus
  the inputs of recomputed (checkpointed) regions, which the checkpoint keeps instead of saving.
  Parameters saved by the ops that use them are not activations and are left out, nor are the
  pipeline's receive buffers (kept for the whole step; the cost model counts them as buffers).

The result is the largest value of each component over the step; ``states``: the largest sum
of the resident parameters, gradients and optimizer states at one sample point; ``states_peak``:
the same with gathered copies (FSDP2 unsharded parameters and gradients) included;
``total``: the largest ``states_peak`` + activations at one sample point; ``host``: the largest sum
of the parameters, gradients and optimizer states FSDP2 keeps in host memory (``CPUOffloadPolicy``:
its ``offload_to_cpu`` parameters), which the other components then leave out. Parameters are every
parameter of the model parts as held between steps (the resident shards), frozen ones included.
"""

from __future__ import annotations

import weakref
from contextlib import ExitStack
from typing import Any

import torch

COMPONENTS = ("params", "grads", "optimizer", "states", "states_peak", "activations", "total", "host")


def _storage(t: torch.Tensor):
    """The untyped storage behind ``t`` (the local shard of a DTensor)."""
    local = getattr(t, "_local_tensor", t)
    return local.untyped_storage()


def _is_parameter(t: torch.Tensor) -> bool:
    """A parameter, or a view of one (``weight.t()`` saved by a linear layer)."""
    local = getattr(t, "_local_tensor", t)
    base = local._base if local._base is not None else local
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


def _add(seen: dict[int, int], t: Any) -> None:
    if isinstance(t, torch.Tensor):
        st = _storage(t)
        seen[id(st)] = st.nbytes()


class MemoryProbe:
    """Install on a ``planner.launch.torchjob.trainer.Job``; read ``peak`` after a step."""

    def __init__(self, job) -> None:
        self.job = job
        self.peak = dict.fromkeys(COMPONENTS, 0)
        self._live: dict[int, int] = {}
        """Storages saved for backward and still alive (ids; sizes are read when sampling)."""
        self._refs: dict[int, weakref.ref] = {}
        held = [p for opt in job.optimizers for g in opt.param_groups for p in g["params"]]
        held += [p for _, part in job.parts for p in part.parameters()]
        self._params = list({id(p): p for p in held}.values())
        self._fsdp = self._fsdp_params()
        self._offloaded = {id(fp.sharded_param) for fp in self._fsdp if getattr(fp, "offload_to_cpu", False)}
        unsharded = [getattr(fp, "_unsharded_param", None) for fp in self._fsdp]
        self._param_ids = {id(_storage(p)) for p in self._params + [u for u in unsharded if u is not None]}
        self._stack = ExitStack()
        self._slots = [(module, name) for _, part in job.parts for module in part.modules()
                       for name in module._parameters]
        """Where the modules register parameters: FSDP2 swaps sharded and gathered tensors in these
        slots, so ``census`` reads them each time (cheaper than walking the modules)."""
        self._receive_count, self._receive_ids = 0, set()

    # -- activations ------------------------------------------------------------------------
    def _receive_buffer_ids(self) -> set[int]:
        """Storages of the pipeline's receive buffers: ``torch.distributed.pipelining`` keeps one
        per micro-batch for the whole step (``PipelineStage.args_recv_info``); the dry run keeps
        its stand-ins in ``job.recv_buffers``. They are buffers, not activations."""
        schedule = getattr(self.job, "schedule", None)
        stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
        buffers = [info.buffer for stage in stages if stage is not None
                   for infos in getattr(stage, "args_recv_info", {}).values() for info in infos
                   if isinstance(getattr(info, "buffer", None), torch.Tensor)]
        buffers += list(getattr(self.job, "recv_buffers", ()))
        if len(buffers) != self._receive_count:  # buffers appear as micro-batches arrive
            self._receive_count = len(buffers)
            self._receive_ids = {id(_storage(b)) for b in buffers}
        return self._receive_ids

    def _track(self, t: torch.Tensor) -> None:
        st = _storage(t)
        key = id(st)
        if key in self._live or key in self._param_ids or st.nbytes() == 0:
            return
        if key in self._receive_buffer_ids():
            return
        self._live[key] = 1
        self._refs[key] = weakref.ref(st, lambda _ref, k=key: self._release(k))

    def _release(self, key: int) -> None:
        self._live.pop(key, None)
        self._refs.pop(key, None)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        """Track ``t`` and keep it detached: a saved graph output kept with its ``grad_fn`` would
        own the node that owns it, a cycle no collector breaks when that node never runs backward
        (the zero-bubble weight pass runs only the weight-gradient nodes after an input pass with
        ``retain_graph=True``), so the probe itself would keep the rest of the graph alive.
        Autograd saves outputs without their ``grad_fn`` for this reason and restores it on
        unpacking (pytorch/pytorch#189025; ``torch/csrc/autograd/saved_variable.cpp``)."""
        if not _is_parameter(t):
            self._track(t)
        self.sample()
        return t.detach()

    def _unpack(self, t: torch.Tensor) -> torch.Tensor:
        self.sample()
        return t

    def track_inputs(self, *args: Any) -> None:
        """Count tensors a checkpoint keeps for recomputation (its inputs) as saved activations."""
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                self._track(a)

    # -- model states -------------------------------------------------------------------------
    def _fsdp_params(self) -> list:
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # pragma: no cover - torch without FSDP2
            return []
        out = []
        for _, part in self.job.parts:
            for module in part.modules():
                if isinstance(module, FSDPModule):
                    group = module._get_fsdp_state()._fsdp_param_group
                    out.extend(group.fsdp_params if group is not None else [])
        return out

    def census(self) -> dict[str, int]:
        """Bytes alive now, each storage once: the optimizer's parameters (the resident shards),
        their gradients, the optimizer states, and ``states_peak``: those plus every gathered
        copy (FSDP2's unsharded parameters and gradients, the modules' registered parameters)."""
        params: dict[int, int] = {}
        grads: dict[int, int] = {}
        host: dict[int, int] = {}
        for p in self._params:
            _add(host if id(p) in self._offloaded else params, p)
            _add(host if id(p) in self._offloaded else grads, p.grad)
        states: dict[int, int] = {}
        for opt in self.job.optimizers:
            for param, state in opt.state.items():
                for value in state.values():
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        _add(host if id(param) in self._offloaded else states, value)
        gathered = dict(params) | grads | states
        extra = [module._parameters.get(name) for module, name in self._slots]
        for fp in self._fsdp:
            extra.append(getattr(fp, "_unsharded_param", None))
            _add(gathered, getattr(fp, "unsharded_accumulated_grad", None))
        for t in extra:
            if isinstance(t, torch.Tensor) and id(t) not in self._offloaded:
                _add(gathered, t)
                _add(gathered, t.grad)
        return {"params": sum(params.values()), "grads": sum(grads.values()), "optimizer": sum(states.values()),
                "states_peak": sum(gathered.values()), "host": sum(host.values())}

    def sample(self) -> None:
        """Update the per-component peaks with the current census and live activations."""
        now = self.census()
        now["states"] = now["params"] + now["grads"] + now["optimizer"]
        now["activations"] = sum(st.nbytes() for st in (ref() for ref in self._refs.values()) if st is not None)
        now["total"] = now["states_peak"] + now["activations"]
        for key, value in now.items():
            self.peak[key] = max(self.peak[key], value)

    # -- installation -------------------------------------------------------------------------
    def __enter__(self) -> "MemoryProbe":
        self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
        handles = [opt.register_step_pre_hook(lambda *_: self.sample()) for opt in self.job.optimizers]
        handles += [opt.register_step_post_hook(lambda *_: self.sample()) for opt in self.job.optimizers]
        handles += self._checkpoint_hooks()
        self._stack.callback(lambda: [h.remove() for h in handles])
        self._stack.enter_context(_patched_checkpoint(self))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sample()
        self._stack.close()

    def _checkpoint_hooks(self) -> list:
        """Forward pre-hooks on recomputation wrappers: their inputs stay alive until backward."""
        handles = []
        for _, part in self.job.parts:
            for module in part.modules():
                if hasattr(module, "_checkpoint_wrapped_module"):
                    handles.append(module.register_forward_pre_hook(lambda _m, args: self.track_inputs(*args)))
        return handles


class _patched_checkpoint:
    """Selective recomputation calls ``torch.utils.checkpoint.checkpoint`` from the runtime model;
    count its tensor inputs as saved activations while the probe is installed."""

    def __init__(self, probe: MemoryProbe) -> None:
        self.probe = probe

    def __enter__(self) -> None:
        from planner.launch.torchjob import model

        self.original = model.checkpoint

        def counted(fn, *args, **kwargs):
            self.probe.track_inputs(*args)
            return self.original(fn, *args, **kwargs)

        model.checkpoint = counted

    def __exit__(self, *exc: Any) -> None:
        from planner.launch.torchjob import model

        model.checkpoint = self.original
