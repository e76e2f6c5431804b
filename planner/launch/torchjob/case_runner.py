"""Run several layouts one after another in one process group and record their losses.

Used by the loss-parity tests: one torchrun launch per world size covers many layouts, since
starting processes costs far more on a small machine than a few steps of a tiny model.

    torchrun --standalone --nproc-per-node 4 -m planner.launch.torchjob.case_runner cases.json results.json

``cases.json`` is a list of {"name", "model", "layout", "seq_len", "steps", "lr", "max_norm",
"seed"} and optionally "lora_rank" and "lora_targets"; "model" is a preset name or a ModelSpec dict, or a case gives "module" ("pkg.mod:factory",
a user's model) instead; an optional "tp_plan" ({module fqn: style}) replaces the fixed TP plan. Cases whose world size differs from the
launch are skipped. ``results.json`` maps each name to its per-step {"loss", "grad_norm"}.
Run without torchrun (``python -m planner.launch.torchjob.case_runner ...``) it runs the single-process
cases, without a process group: the reference.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

from costmodels.layout import Layout
from costmodels.model_spec import model_from_dict
from costmodels.presets import load_model

from .data import SyntheticTokens
from .parallel import build_meshes, mesh_shape
from .trainer import init_distributed, pick_device, setup_job, train_step


def run_case(case: dict, device: torch.device, meshes: dict | None = None) -> list[dict]:
    """Train ``case["steps"]`` steps of one layout from the seed; per-step loss and grad norm.

    ``meshes`` ({``mesh_shape``: ``Meshes``}, filled here) keeps the device meshes of the cases run
    before in this process group: a case whose layout has the same mesh shape reuses them rather
    than creating its process groups again (on a small CPU machine that costs about a sixth of a
    launch's CPU time, and the sharding rules DTensor caches per mesh stay valid)."""
    model = case.get("model")
    spec = None if model is None else load_model(model) if isinstance(model, str) else model_from_dict(model)
    layout = Layout.from_dict(case["layout"])
    known = None
    if meshes is not None and dist.is_initialized():
        key = mesh_shape(layout)
        if key not in meshes:
            meshes[key] = build_meshes(layout, device.type)
        known = meshes[key]
    job = setup_job(spec, layout, device=device, seed=case.get("seed", 0), lr=case.get("lr", 1e-3),
                    module=case.get("module"), tp_plan=case.get("tp_plan"), seq_len=case["seq_len"],
                    lora_rank=case.get("lora_rank", 0), lora_targets=tuple(case.get("lora_targets", ())),
                    meshes=known)
    source = SyntheticTokens(job.vocab_size, case.get("seed", 0))
    return [train_step(job, source, step, seq_len=case["seq_len"], max_norm=case.get("max_norm", 1.0))
            for step in range(case["steps"])]


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    cases_path, out_path = argv
    device = pick_device()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        init_distributed(device)
    world = dist.get_world_size() if distributed else 1
    with open(cases_path, encoding="utf-8") as handle:
        cases = json.load(handle)
    results, meshes = {}, {}
    for case in cases:
        if Layout.from_dict(case["layout"]).world_size == world:
            results[case["name"]] = run_case(case, device, meshes)
            if distributed:
                dist.barrier()
    if not distributed or dist.get_rank() == 0:
        with open(out_path, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1, sort_keys=True, allow_nan=False)
    if distributed:
        dist.destroy_process_group()

if __name__ == "__main__":
    main(sys.argv[1:])
