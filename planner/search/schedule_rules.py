"""A mesh's schedule choices under its runtime's job rules, for the exact search: the rules asked once
per value of the schedule fields they read (``framework_rules.SCHEDULE_READS``), and the choices
counted without being built.

``space.schedule_choices`` asks the rules of every choice, one layout each: tens of thousands of
layouts for a large job, most of them for meshes the search then cuts on a floor, where only their
count matters (the space size and the rejected counts). Two choices that agree on the fields the
rules read get the same answer, so ``RuleCheck`` keeps each answer by those fields, and
``num_runnable_schedules`` counts the choices by pipeline choices that agree on them, with their
multiplicity. Both equal the plain forms (``tests/test_schedule_rules.py``; the brute-force twin
walks ``space.schedule_choices``)."""

from __future__ import annotations

from operator import attrgetter

from costmodels.layout import ep_overlap_runs
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec

from .framework_rules import SCHEDULE_READS
from .space import (MeshChoice, PipelineChoice, ScheduleChoice, SearchOptions, candidate_schedules,
                    ep_overlap_values, neutral_state, num_schedule_choices, rules_pass, schedule_choice,
                    sequence_parallel_values, tp_overlap_values)

PIPE_FIELDS = tuple(PipelineChoice.__dataclass_fields__)
"""The schedule-choice fields a pipeline choice sets."""


class RuleCheck:
    """The job rules' answer for the schedule choices of one mesh, kept by the fields they read."""

    def __init__(self, options: SearchOptions, model: ModelSpec, training: TrainingSpec, mesh: MeshChoice) -> None:
        self.options, self.model, self.training, self.mesh = options, model, training, mesh
        self.state = neutral_state(options, model, training, mesh)
        reads = SCHEDULE_READS[options.job_rules]
        self.key = attrgetter(*reads) if len(reads) > 1 else (lambda sched: (getattr(sched, reads[0]),))
        self.pipe_key = _fields_key(tuple(name for name in reads if name in PIPE_FIELDS))
        self.answers: dict[tuple, bool] = {}

    def passes(self, sched: ScheduleChoice) -> bool:
        """``space.rules_pass`` of ``sched`` with the mesh's neutral state (False where none passes)."""
        if self.state is None:
            return False
        key = self.key(sched)
        answer = self.answers.get(key)
        if answer is None:
            answer = self.answers[key] = rules_pass(self.options, self.model, self.training, self.mesh, self.state,
                                                    sched)
        return answer


def _fields_key(names: tuple[str, ...]):
    """A function giving a choice's values of ``names`` as a tuple."""
    return lambda choice: tuple(getattr(choice, name) for name in names)


def runnable_schedules(check: RuleCheck | None, mesh: MeshChoice, model: ModelSpec, training: TrainingSpec,
                       options: SearchOptions, pipes: list[PipelineChoice],
                       sp_values: tuple[bool, ...] | None = None) -> list[ScheduleChoice]:
    """``space.schedule_choices`` (same choices, same order), the rules asked through ``check``
    (None where ``options`` has no job rules)."""
    out = candidate_schedules(mesh, model, training, options, pipes, sp_values)
    return out if check is None else [sched for sched in out if check.passes(sched)]


def num_runnable_schedules(check: RuleCheck | None, mesh: MeshChoice, model: ModelSpec, training: TrainingSpec,
                           options: SearchOptions, pipes: list[PipelineChoice]) -> int:
    """``len(space.schedule_choices(...))`` without building them: pipeline choices that agree on the
    fields the rules read (and on whether EP overlap runs with their schedule) are counted once, times
    their number, over each recomputation mode, (SP, TP overlap) pair and EP overlap value."""
    if check is None:
        return num_schedule_choices(mesh, model, training, options, pipes)
    if check.state is None:
        return 0
    classes: dict[tuple, list] = {}  # key -> [a pipeline choice, how many agree with it]
    for pipe in pipes:
        key = (check.pipe_key(pipe), ep_overlap_runs(mesh.pp, pipe.schedule))
        entry = classes.get(key)
        if entry is None:
            classes[key] = [pipe, 1]
        else:
            entry[1] += 1
    tp_values = tp_overlap_values(sequence_parallel_values(mesh, training), options)
    ep_values = ep_overlap_values(mesh, model, options)
    return sum(count for (_, overlap_runs), (pipe, count) in classes.items()
               for recompute in options.recompute_modes for sp, overlap in tp_values for ep_overlap in ep_values
               if (not ep_overlap or overlap_runs) and check.passes(schedule_choice(pipe, recompute, sp, overlap,
                                                                                     ep_overlap)))
