"""Pipeline stages and schedules from ``torch.distributed.pipelining``.

GPipe and 1F1B run one stage per pp rank; interleaved 1F1B and interleaved zero bubble run
``virtual_stages`` stages per rank in the looped placement (rank r holds stages r, r + pp, ...), as
in Narayanan et al. 2021; ZB-H1 is torch's interleaved zero-bubble schedule with one stage per rank;
ZB-V and DualPipeV run two stages per rank in a V (r and 2·pp − 1 − r). DualPipe is not in torch
2.13 (``planner.search.launchable`` refuses it). Gradients are divided by the number of micro-batches
(``scale_grads``), matching the mean loss.
"""

from __future__ import annotations

import torch

SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                    "zb-h1": "ScheduleInterleavedZeroBubble", "interleaved-zb": "ScheduleInterleavedZeroBubble",
                    "zb-v": "ScheduleZBVZeroBubble", "dualpipe-v": "ScheduleDualPipeV"}
SINGLE_STAGE = ("gpipe", "1f1b")
"""Schedules whose torch class takes one stage; the others take the list of this rank's stages."""


def build_schedule(job, loss_fn):
    """The plan's schedule over this rank's stages (communication on the pp sub-mesh)."""
    from torch.distributed import pipelining

    group = job.meshes.pp.get_group()
    stages = [pipelining.PipelineStage(part, index, job.layout.num_chunks, job.device, group=group)
              for index, part in job.parts]
    cls = getattr(pipelining, SCHEDULE_CLASSES[job.layout.schedule])
    m = job.layout.num_microbatches
    if job.layout.schedule in SINGLE_STAGE:
        return cls(stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=True)
    return cls(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=True)


def pipeline_step(job, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
    """Run the schedule for one step; the mean micro-batch loss on the last stage, else None.

    ``return_outputs=False``: otherwise the last stage keeps every micro-batch's output, the
    logits, until the next step (``PipelineStage.forward_one_chunk`` appends them to
    ``output_chunks``; ``save_forward_output`` in torch/distributed/pipelining/schedules.py), m
    logits tensors the step never reads and the cost model does not count."""
    losses: list[torch.Tensor] = []
    target = labels if job.has_last else None
    if job.has_first:
        job.schedule.step(inputs, target=target, losses=losses, return_outputs=False)
    else:
        job.schedule.step(target=target, losses=losses, return_outputs=False)
    if not job.has_last:
        return None
    return torch.stack([loss.detach().float() for loss in losses]).mean()
