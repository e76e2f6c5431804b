"""A mesh's schedule choices under its runtime's job rules, for the exact search: the rules asked once
per value of the schedule fields they read (``framework_rules.SCHEDULE_READS``), and the choices
counted without being built.

``space.schedule_choices`` asks the rules of every choice, one layout each: tens of thousands of
layouts for a large job, most of them for meshes the search then cuts on a floor, where only their
count matters (the space size and the rejected counts). Two choices that agree on the fields the
rules read get the same answer, so ``RuleCheck`` keeps each answer by those fields, and
``num_runnable_schedules`` counts the choices by pipeline choices that agree on them, with their
multiplicity (each class's count of runnable values kept too). Meshes that agree on the mesh fields
the rules read (``framework_rules.MESH_READS``) and on their neutral state share one ``RuleCheck``
(``SharedRuleChecks``): a search of 16,384 GPUs has hundreds of meshes but a few dozen such classes.
All equal the plain forms (``tests/test_schedule_rules.py``; the brute-force twin walks
``space.schedule_choices``)."""

from __future__ import annotations

from operator import attrgetter

from costmodels.layout import ep_overlap_runs
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec

from .framework_rules import MESH_READS, SCHEDULE_READS
from .space import (MeshChoice, PipelineChoice, ScheduleChoice, SearchOptions, StateChoice, candidate_schedules,
                    ep_overlap_values, neutral_state, num_schedule_choices, rules_pass, schedule_choice,
                    sequence_parallel_values, tp_overlap_values)

PIPE_FIELDS = tuple(PipelineChoice.__dataclass_fields__)
"""The schedule-choice fields a pipeline choice sets."""


class RuleCheck:
    """The job rules' answer for the schedule choices of one mesh, kept by the fields they read
    (made by ``SharedRuleChecks``, which shares it among the meshes that get the same answers)."""

    def __init__(self, options: SearchOptions, model: ModelSpec, training: TrainingSpec, mesh: MeshChoice,
                 state: StateChoice | None) -> None:
        """``state``: the mesh's ``space.neutral_state`` (None where no state passes the rules)."""
        self.options, self.model, self.training, self.mesh = options, model, training, mesh
        self.state = state
        reads = SCHEDULE_READS[options.job_rules]
        self.key = attrgetter(*reads) if len(reads) > 1 else (lambda sched: (getattr(sched, reads[0]),))
        self.pipe_key = _fields_key(tuple(name for name in reads if name in PIPE_FIELDS))
        self.answers: dict[tuple, bool] = {}
        self.runnable: dict[tuple, int] = {}
        """By (``pipe_key``, whether EP overlap runs, the (SP, TP overlap) and EP overlap values): how
        many of a pipeline choice's (recomputation, SP, TP overlap, EP overlap) values pass."""

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

    def runnable_values(self, pipe: PipelineChoice, overlap_runs: bool, tp_values: list[tuple[bool, bool]],
                        ep_values: tuple[bool, ...]) -> int:
        """How many of ``pipe``'s (recomputation, SP, TP overlap, EP overlap) values pass the rules,
        kept by what the answer reads of it (``pipe_key``, and whether EP overlap runs with its
        schedule: ``layout.ep_overlap_runs``)."""
        key = (self.pipe_key(pipe), overlap_runs, tuple(tp_values), ep_values)
        count = self.runnable.get(key)
        if count is None:
            count = self.runnable[key] = sum(
                1 for recompute in self.options.recompute_modes for sp, overlap in tp_values for ep_overlap in ep_values
                if (not ep_overlap or overlap_runs) and self.passes(schedule_choice(pipe, recompute, sp, overlap,
                                                                                    ep_overlap)))
        return count


class SharedRuleChecks:
    """One ``RuleCheck`` per class of meshes that agree on the mesh fields the rules read
    (``framework_rules.MESH_READS``) and on their neutral state: every answer of the class is the
    same, since a rule reads of a layout only those mesh fields, the state and the schedule fields
    of ``SCHEDULE_READS``."""

    def __init__(self, options: SearchOptions, model: ModelSpec, training: TrainingSpec) -> None:
        self.options, self.model, self.training = options, model, training
        self.mesh_key = attrgetter(*MESH_READS[options.job_rules]) if options.job_rules else None
        self.checks: dict[tuple, RuleCheck] = {}

    def of(self, mesh: MeshChoice) -> RuleCheck | None:
        """The rules' answers for ``mesh``'s schedule choices (None where ``options`` has no job rules)."""
        if self.mesh_key is None:
            return None
        state = neutral_state(self.options, self.model, self.training, mesh)
        key = (self.mesh_key(mesh), state)
        check = self.checks.get(key)
        if check is None:
            check = self.checks[key] = RuleCheck(self.options, self.model, self.training, mesh, state)
        return check


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
    return sum(count * check.runnable_values(pipe, overlap_runs, tp_values, ep_values)
               for (_, overlap_runs), (pipe, count) in classes.items())
