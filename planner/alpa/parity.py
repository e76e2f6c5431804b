"""Check a tensor-parallel plan against a single-process run (run under torchrun, gloo on CPU).

    torchrun --standalone --nproc-per-node 2 -m planner.alpa.parity \\
        --case pkg.mod:factory 4,64 shard.json [--case ...] --out result.json

Every rank builds the same model (seed 0), keeps an untouched copy as the single-process
reference, applies the plan's ``tp_plan`` to the other with ``parallelize_module`` on a 1-D
``tp`` mesh of all ranks, and trains both for ``--steps`` SGD steps on the same tokens. Rank 0
writes both loss curves. Uses PyTorch's own TP; nothing here is specific to autoplan's model.
"""

from __future__ import annotations

import argparse
import copy
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _losses(model, tokens, targets, steps: int, lr: float) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for _ in range(steps):
        logits = model(tokens)
        if hasattr(logits, "full_tensor"):
            logits = logits.full_tensor()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def _case(factory: str, input_shape: str, plan_path: str, mesh, steps: int, lr: float) -> dict:
    from planner.launch.torchjob.tp_styles import apply_tp_plan
    from planner.launch.torchjob.user_model import load_factory

    torch.manual_seed(0)
    reference = load_factory(factory)()
    parallel = copy.deepcopy(reference)
    with open(plan_path, encoding="utf-8") as handle:
        plan = json.load(handle)["tp_plan"]
    apply_tp_plan(parallel, mesh, plan)
    shape = tuple(int(x) for x in input_shape.split(","))
    with torch.no_grad():
        vocab = reference(torch.zeros(shape, dtype=torch.long)).shape[-1]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, shape, generator=gen)
    targets = torch.randint(0, vocab, shape, generator=gen)
    return {"tp_plan": plan, "reference": _losses(reference, tokens, targets, steps, lr),
            "parallel": _losses(parallel, tokens, targets, steps, lr)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs=3, action="append", required=True, metavar=("FACTORY", "SHAPE", "PLAN"),
                        help="pkg.mod:factory, token shape B,S, and a JSON file with a tp_plan (autoplan shard --out).")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()

    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    result = {"world_size": world,
              "cases": {factory: _case(factory, shape, plan, mesh, args.steps, args.lr)
                        for factory, shape, plan in args.case}}
    if dist.get_rank() == 0:
        tmp = f"{args.out}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1, sort_keys=True, allow_nan=False)
        os.replace(tmp, args.out)
    dist.barrier()  # no rank tears gloo down while another still has a collective in flight
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
