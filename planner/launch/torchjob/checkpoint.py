"""Distributed checkpoints with ``torch.distributed.checkpoint`` (DCP): save every K steps, resume.

Layout on disk: ``DIR/step-00000012/`` holds the DCP shards of every model part and optimizer
(keys by parameter name, so a checkpoint does not depend on how recomputation wraps blocks) and
``train_state.json``, written by rank 0 only after every rank finished saving: a directory
without it is an interrupted save and is ignored when resuming.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch.distributed as dist

STATE_FILE = "train_state.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def latest_complete(root: str | Path | None) -> tuple[int, Path] | None:
    """(step, path) of the newest completed checkpoint under ``root``, or None."""
    if not root or not Path(root).is_dir():
        return None
    found = []
    for path in Path(root).iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return max(found) if found else None


def _part_states(job) -> list[tuple[dict, dict]]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=True)
    return [get_state_dict(part, optimizer, options=options)
            for (_, part), optimizer in zip(job.parts, job.optimizers)]


def _expert_suffix(job) -> str:
    """Experts split over ep (and tp) ranks are different tensors under one name, which DCP would
    take for replicas: their keys carry this rank's piece, ``@ep<r>.tp<r>`` (resume needs the same
    ep and tp, as it needs the same plan)."""
    meshes = job.meshes
    if meshes is None or (meshes.ep is None and meshes.tp is None):
        return ""
    ep = meshes.ep.get_local_rank() if meshes.ep is not None else 0
    tp = meshes.tp.get_local_rank() if meshes.tp is not None else 0
    return f"@ep{ep}.tp{tp}"


def _key(kind: str, name: str, suffix: str) -> str:
    return f"{kind}.{name}{suffix if suffix and 'moe.experts.' in name else ''}"


def _merged(states: list[tuple[dict, dict]], suffix: str = "") -> dict:
    """One flat dict of every part: "model.<fqn>" and "optim.<flattened key>"."""
    merged = {}
    for model_state, optim_state in states:
        merged.update({_key("model", k, suffix): v for k, v in model_state.items()})
        merged.update({_key("optim", k, suffix): v for k, v in optim_state.items()})
    return merged


def save(job, root: str | Path, step: int) -> Path:
    """Write the checkpoint of the state after ``step`` completed steps (collective)."""
    import torch.distributed.checkpoint as dcp

    path = step_dir(root, step)
    dcp.save(_merged(_part_states(job), _expert_suffix(job)), checkpoint_id=str(path))
    if dist.is_initialized():
        dist.barrier()
    if not dist.is_initialized() or dist.get_rank() == 0:
        (path / STATE_FILE).write_text(json.dumps({"step": step}, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
    if dist.is_initialized():
        dist.barrier()
    return path


def load(job, path: str | Path) -> int:
    """Restore model and optimizer state from ``path``; returns the completed step count."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    states, suffix = _part_states(job), _expert_suffix(job)
    merged = _merged(states, suffix)
    dcp.load(merged, checkpoint_id=str(path))
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    for ((_, part), optimizer), (model_state, optim_state) in zip(zip(job.parts, job.optimizers), states):
        set_state_dict(part, optimizer,
                       model_state_dict={k: merged[_key("model", k, suffix)] for k in model_state},
                       optim_state_dict={k: merged[_key("optim", k, suffix)] for k in optim_state},
                       options=options)
    return int(json.loads((Path(path) / STATE_FILE).read_text(encoding="utf-8"))["step"])
