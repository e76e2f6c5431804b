"""``PlanFile``: the plan file (``autoplan plan --out``) as a frozen, validated type.

The one reader and writer of plan files: ``explain``, ``launch``, ``validate``, ``shard
--attach``, the plots and the launched job all go through ``read_plan_file`` /
``PlanFile.from_json``, and ``PlanReport`` writes through ``PlanFile.to_json``. Every field is
checked where it enters, and a bad one is named by its dotted path (``best.layout.zero_stage``).
It lives beside the runtime because the generated job copies it and reads its plan with it;
it imports only the spec modules, never torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from costmodels.capabilities import Narrowing
from costmodels.layout import Layout, layout_problems
from costmodels.model_spec import ModelSpec, model_from_dict, model_to_dict
from costmodels.training import TrainingSpec
from planner.plan.predicted_check import check_predicted
from autoplan_base.errors import AutoplanError, file_wording
from hardware_specs.files import parse_json, read_json

SCHEMA_VERSION = 2
MAX_PLAN_FILE_BYTES = 64 * 2**20
"""Plan files above this are refused unread (a real one is a few hundred KiB at most)."""
PLAN_FILE_FIELDS = {"gpus": "inputs.gpus", "seq_len": "inputs.training.seq_len",
                    "global_batch": "inputs.training.global_batch_size"}
"""How a layout's problems name the inputs they read, as a plan file spells them."""
TRAINING_KEYS = ("global_batch_size", "seq_len", "precision", "optimizer", "lora_rank", "attention", "runtime")
"""``inputs.training`` keys a plan file always carries (``lora_targets``, ``fp8_recipe`` and
``context_attention`` only when set or not the default)."""


class PlanFileError(AutoplanError):
    """A plan file that is missing, unreadable, corrupt, of another schema version, or malformed."""


def _get(raw: dict, key: str, where: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    """``raw[key]`` checked to be of ``kind``; a bad or missing value names ``where.key``."""
    path = f"{where}.{key}" if where else key
    if key not in raw or raw[key] is None:
        if optional:
            return None
        raise PlanFileError(f"{path}: missing; regenerate the plan with 'autoplan plan --out'")
    value = raw[key]
    bad_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if not isinstance(value, kind) or bad_bool:
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise PlanFileError(f"{path}: expected {names}, got {json.dumps(value)[:60]}")
    return value


def _spec(build, raw: Any, where: str):
    """``build(raw)`` with its error re-worded to name ``where``."""
    if not isinstance(raw, dict):
        raise PlanFileError(f"{where}: expected an object, got {json.dumps(raw)[:60]}")
    try:
        return build(raw)
    except (AutoplanError, TypeError) as err:
        text = str(err)
        for own_name in ("layout", "model_spec"):  # the spec's own name for itself becomes ``where``
            if text.startswith((own_name + ".", own_name + ":")):
                raise PlanFileError(f"{where}{text[len(own_name):]}") from None
        raise PlanFileError(f"{where}: {text}") from None


def _optional(value: Any, default: Any) -> Any:
    return default if value is None else value


def _narrowing(raw: dict | None, where: str) -> dict | None:
    """``inputs.narrowing`` checked by ``Narrowing.from_dict`` and kept in its canonical form."""
    if raw is None:
        return None
    try:
        return Narrowing.from_dict(raw).to_dict()
    except (TypeError, ValueError) as e:
        raise PlanFileError(f"{where}: {e}") from None


def _training(raw: dict) -> TrainingSpec:
    values = dict(raw)
    if "lora_targets" in values:
        values["lora_targets"] = tuple(values["lora_targets"])
    return TrainingSpec(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanInputs:
    """What was asked (``inputs``): the model and its spec, hardware, GPUs, training, options."""

    model: str
    model_spec: ModelSpec
    hardware: str
    gpus: int
    gpus_per_node: int
    training: TrainingSpec
    memory_fraction: float = 0.95
    profile: str | None = None
    top_k: int | None = None
    """``plan`` options; None in an ``evaluate`` plan file."""
    allow_cross_node_tp: bool | None = None
    launchable: bool | None = None
    module: str | None = None
    """A user's model (``pkg.mod:factory``), set by ``autoplan shard --module ... --attach``."""
    input_shape: tuple[int, ...] | None = None
    profile_device_mismatch: tuple[str, ...] | None = None
    """How the profile differs from the cluster, when the user allowed it
    (``--profile-device-mismatch ok``); None when the profile matches or there is none."""
    layers_per_chunk: tuple[int, ...] | None = None
    """The split ``plan --layers-per-chunk`` forced (layers per model chunk); None when not given."""
    first_stage_layers: int | None = None
    """``plan --first-stage-layers`` (Megatron's form); None when not given."""
    last_stage_layers: int | None = None
    """``plan --last-stage-layers``; None when not given."""
    runtime_version: str | None = None
    """The release of ``training.runtime`` whose capability table was searched (``plan
    --runtime-version``, default the table's latest); None in an ``evaluate`` plan file and in plan
    files written before runtimes had versions (read as the latest)."""
    narrowing: dict[str, Any] | None = None
    """How the user narrowed the runtime's space (``costmodels.capabilities.Narrowing.to_dict``:
    ``{"tp": [1, 2], "schedules": ["1f1b"], "allow_offload": false, ...}``); None when not narrowed."""

    @classmethod
    def from_dict(cls, raw: Any, where: str = "inputs") -> "PlanInputs":
        if not isinstance(raw, dict):
            raise PlanFileError(f"{where}: expected an object")
        module = _get(raw, "module", where, str, optional=True)
        shape = _get(raw, "input_shape", where, list, optional=True)
        fraction = _optional(_get(raw, "memory_fraction", where, (int, float), optional=True), 0.95)
        mismatch = _get(raw, "profile_device_mismatch", where, dict, optional=True)
        problems = None if mismatch is None else _get(mismatch, "problems", f"{where}.profile_device_mismatch", list)
        if problems is not None and not all(isinstance(p, str) for p in problems):
            raise PlanFileError(f"{where}.profile_device_mismatch.problems: expected a list of strings")
        if not 0 < fraction <= 1:
            raise PlanFileError(f"{where}.memory_fraction: must be in (0, 1], got {fraction!r}")
        split = _get(raw, "layers_per_chunk", where, list, optional=True)
        if split is not None and not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in split):
            raise PlanFileError(f"{where}.layers_per_chunk: expected a list of positive layer counts")
        for key in ("gpus", "gpus_per_node"):
            if _get(raw, key, where, int) < 1:
                raise PlanFileError(f"{where}.{key}: must be a positive integer, got {raw[key]!r}")
        return cls(model=_get(raw, "model", where, str),
                   model_spec=_spec(model_from_dict, raw.get("model_spec"), f"{where}.model_spec"),
                   hardware=_get(raw, "hardware", where, str),
                   gpus=_get(raw, "gpus", where, int),
                   gpus_per_node=_get(raw, "gpus_per_node", where, int),
                   training=_spec(_training, raw.get("training"), f"{where}.training"),
                   memory_fraction=fraction,
                   profile=_get(raw, "profile", where, str, optional=True),
                   top_k=_get(raw, "top_k", where, int, optional=True),
                   allow_cross_node_tp=_get(raw, "allow_cross_node_tp", where, bool, optional=True),
                   launchable=_get(raw, "launchable", where, bool, optional=True),
                   module=module, input_shape=None if shape is None else tuple(shape),
                   profile_device_mismatch=None if problems is None else tuple(problems),
                   layers_per_chunk=None if split is None else tuple(split),
                   first_stage_layers=_get(raw, "first_stage_layers", where, int, optional=True),
                   last_stage_layers=_get(raw, "last_stage_layers", where, int, optional=True),
                   runtime_version=_get(raw, "runtime_version", where, str, optional=True),
                   narrowing=_narrowing(_get(raw, "narrowing", where, dict, optional=True), f"{where}.narrowing"))

    def to_dict(self) -> dict[str, Any]:
        t = self.training
        training = {key: getattr(t, key) for key in TRAINING_KEYS}
        if t.lora_targets != TrainingSpec.__dataclass_fields__["lora_targets"].default:
            training["lora_targets"] = list(t.lora_targets)
        if t.fp8_recipe is not None:
            training["fp8_recipe"] = t.fp8_recipe
        if t.context_attention != "ring":  # the default is left out, so ring plans read as before
            training["context_attention"] = t.context_attention
        if t.compiled:  # likewise: uncompiled (what launch runs) is the default
            training["compiled"] = True
        out: dict[str, Any] = {"model": self.model, "model_spec": model_to_dict(self.model_spec),
                               "hardware": self.hardware, "gpus": self.gpus, "gpus_per_node": self.gpus_per_node,
                               "training": training, "memory_fraction": self.memory_fraction,
                               "profile": self.profile}
        for key in ("top_k", "allow_cross_node_tp", "launchable", "module", "first_stage_layers", "last_stage_layers",
                    "runtime_version", "narrowing"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.layers_per_chunk is not None:
            out["layers_per_chunk"] = list(self.layers_per_chunk)
        if self.input_shape is not None:
            out["input_shape"] = list(self.input_shape)
        if self.profile_device_mismatch is not None:
            out["profile_device_mismatch"] = {"allowed": True, "problems": list(self.profile_device_mismatch)}
        return out

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the inputs: two plans with the same digest answer the same question."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanEntry:
    """One plan: its layout and what the cost model predicts for it (``CostBreakdown.predicted_dict``)."""

    layout: Layout
    predicted: dict[str, Any]
    tp_plan: dict[str, str] | None = None
    """Per-module tensor-parallel styles (``autoplan shard --attach``), on ``best`` only."""

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> "PlanEntry":
        if not isinstance(raw, dict):
            raise PlanFileError(f"{where}: expected an object, got {json.dumps(raw)[:60]}")
        tp_plan = _get(raw, "tp_plan", where, dict, optional=True)
        if tp_plan is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in tp_plan.items()):
            raise PlanFileError(f"{where}.tp_plan: expected {{module fqn: style}}; write it with "
                                "'autoplan shard ... --attach'")
        return cls(layout=_spec(Layout.from_dict, raw.get("layout"), f"{where}.layout"),
                   predicted=check_predicted(_get(raw, "predicted", where, dict), f"{where}.predicted",
                                             PlanFileError), tp_plan=tp_plan)

    def to_dict(self) -> dict[str, Any]:
        out = {"layout": self.layout.to_dict(), "predicted": self.predicted}
        if self.tp_plan is not None:
            out["tp_plan"] = dict(sorted(self.tp_plan.items()))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MissEntry:
    """A layout that came closest to fitting, and what would make it fit."""

    entry: PlanEntry
    needed_gib: float
    available_gib: float
    suggestions: tuple[str, ...]

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> "MissEntry":
        entry = PlanEntry.from_dict(raw, where)
        suggestions = _get(raw, "suggestions", where, list)
        return cls(entry=entry, needed_gib=_get(raw, "needed_gib", where, (int, float)),
                   available_gib=_get(raw, "available_gib", where, (int, float)),
                   suggestions=tuple(str(s) for s in suggestions))

    def to_dict(self) -> dict[str, Any]:
        return {**self.entry.to_dict(), "needed_gib": self.needed_gib, "available_gib": self.available_gib,
                "suggestions": list(self.suggestions)}


@dataclass(frozen=True, slots=True, kw_only=True)
class NoFit:
    """Why nothing fits (``PlanReport.no_fit`` whenever ``best`` is None), as numbers a scheduler can act on."""

    reason: str
    """One line: what binds (memory, or why no layout could be formed at all)."""
    model_state_gib: float
    """Parameters, gradients and optimizer states of the whole model, GiB."""
    smallest_fitting_gpus: int | None
    """The smallest GPU count found at which some layout fits (the requested count times 2, 4, ...
    64, then whole nodes bisected below the first that fits: ``search.infeasible.smallest_fitting_gpus``);
    None when none does or when no layout could be formed (``reason`` says which)."""
    fitting_layout: Layout | None
    """The best layout at ``smallest_fitting_gpus``; None with it."""

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> "NoFit":
        if not isinstance(raw, dict):
            raise PlanFileError(f"{where}: expected an object")
        gpus = raw.get("smallest_fitting_gpus")
        if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1):
            raise PlanFileError(f"{where}.smallest_fitting_gpus: expected a positive integer or null, got {gpus!r}")
        layout = raw.get("fitting_layout")
        if (gpus is None) != (layout is None):
            raise PlanFileError(f"{where}: smallest_fitting_gpus and fitting_layout must be both set or both null")
        return cls(reason=_get(raw, "reason", where, str),
                   model_state_gib=_get(raw, "model_state_gib", where, (int, float)),
                   smallest_fitting_gpus=gpus,
                   fitting_layout=None if layout is None else _spec(Layout.from_dict, layout, f"{where}.fitting_layout"))

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "model_state_gib": self.model_state_gib,
                "smallest_fitting_gpus": self.smallest_fitting_gpus,
                "fitting_layout": None if self.fitting_layout is None else self.fitting_layout.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchStats:
    """How the plan was found: solver, layouts in the space, layouts evaluated in full, rejected
    counts by reason; ``seconds`` (wall time) only outside plan files, which stay byte-identical."""

    solver: str
    space_size: int
    evaluated: int
    rejected: dict[str, int] = field(default_factory=dict)
    seconds: float | None = None
    tie_band: float | None = None
    """Plans within this fraction of the fastest count as tied: the cost model cannot tell them apart
    (``planner.search.ranking.tie_band``)."""
    num_tied: int | None = None
    """How many plans were tied with the fastest; the least risky of them is ``best``."""
    tie_band_source: str | None = None
    """Where ``tie_band`` comes from (``costmodels.tie_band.TieBand.source``)."""
    tie_reason: str | None = None
    """Why ``best`` won among the tied plans (``planner.search.ranking.tie_reason``)."""
    recipe: str | None = None
    """The runtime's published recipe for the job and how the pick stands against it: at least as
    fast, or why not (``planner.search.recipes.apply_recipe``); None where it published none."""

    @classmethod
    def from_dict(cls, raw: Any, where: str = "search") -> "SearchStats":
        if not isinstance(raw, dict):
            raise PlanFileError(f"{where}: expected an object, got {json.dumps(raw)[:60]}")
        rejected = _get(raw, "rejected", where, dict, optional=True) or {}
        for reason, count in rejected.items():
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise PlanFileError(f"{where}.rejected.{reason}: expected a non-negative int, "
                                    f"got {json.dumps(count)[:60]}")
        counts = {key: _get(raw, key, where, int) for key in ("space_size", "evaluated")}
        for key, value in counts.items():
            if value < 0:
                raise PlanFileError(f"{where}.{key}: must be a non-negative integer, got {value!r}")
        tied = _get(raw, "num_tied", where, int, optional=True)
        if tied is not None and tied < 0:
            raise PlanFileError(f"{where}.num_tied: must be a non-negative integer, got {tied!r}")
        return cls(solver=_get(raw, "solver", where, str), rejected=rejected,
                   seconds=_get(raw, "seconds", where, (int, float), optional=True),
                   tie_band=_get(raw, "tie_band", where, (int, float), optional=True), num_tied=tied,
                   tie_band_source=_get(raw, "tie_band_source", where, str, optional=True),
                   tie_reason=_get(raw, "tie_reason", where, str, optional=True),
                   recipe=_get(raw, "recipe", where, str, optional=True), **counts)

    def to_dict(self) -> dict[str, Any]:
        out = {"solver": self.solver, "space_size": self.space_size, "evaluated": self.evaluated,
               "rejected": dict(sorted(self.rejected.items()))}
        for key in ("seconds", "tie_band", "tie_band_source", "num_tied", "tie_reason", "recipe"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFile:
    """A whole plan file: inputs, best plan (None when nothing fits), ranked alternatives, search."""

    inputs: PlanInputs
    inputs_digest: str
    best: PlanEntry | None
    candidates: tuple[PlanEntry, ...]
    search: SearchStats
    closest_misses: tuple[MissEntry, ...] = ()
    no_fit: NoFit | None = None
    """Why nothing fits, written whenever a search left ``best`` None."""
    warnings: tuple[str, ...] = ()
    """What the request asks that the model was not built for (``api.Job.warnings``); written only when any."""

    @classmethod
    def from_dict(cls, raw: Any) -> "PlanFile":
        if not isinstance(raw, dict) or "schema_version" not in raw:
            raise PlanFileError("no schema_version; is it an autoplan plan file?")
        if raw["schema_version"] != SCHEMA_VERSION:
            raise PlanFileError(f"schema_version {raw['schema_version']!r} is not {SCHEMA_VERSION}; "
                                "regenerate it with this autoplan")
        best = raw.get("best", ...)
        if best is ...:
            raise PlanFileError("best: missing; regenerate the plan with 'autoplan plan --out'")
        candidates = _get(raw, "candidates", "", list)
        misses = _get(raw, "closest_misses", "", list, optional=True) or []
        warnings = _get(raw, "warnings", "", list, optional=True) or []
        no_fit = raw.get("no_fit")
        if not all(isinstance(w, str) for w in warnings):
            raise PlanFileError("warnings: expected a list of strings")
        plan = cls(inputs=PlanInputs.from_dict(raw.get("inputs")),
                   inputs_digest=_get(raw, "inputs_digest", "", str),
                   best=None if best is None else PlanEntry.from_dict(best, "best"),
                   candidates=tuple(PlanEntry.from_dict(c, f"candidates.{i}") for i, c in enumerate(candidates)),
                   search=SearchStats.from_dict(raw.get("search")),
                   closest_misses=tuple(MissEntry.from_dict(m, f"closest_misses.{i}") for i, m in enumerate(misses)),
                   no_fit=None if no_fit is None else NoFit.from_dict(no_fit, "no_fit"),
                   warnings=tuple(warnings))
        plan.check_layouts()
        return plan

    def check_layouts(self) -> None:
        """Refuse a plan whose layouts do not fit its own inputs (``costmodels.layout.layout_problems``:
        the GPU count, the batch, the model's heads and layers), naming the entry: the predictions
        were made for a layout of these inputs, so such a file was edited by hand."""
        inputs = self.inputs
        entries = [("best", self.best)] + [(f"candidates.{i}", c) for i, c in enumerate(self.candidates)]
        for where, entry in entries:
            if entry is None:
                continue
            with file_wording(PLAN_FILE_FIELDS):
                problems = layout_problems(entry.layout, inputs.model_spec, inputs.training, inputs.gpus,
                                           inputs.gpus_per_node)
            if problems:
                raise PlanFileError(f"{where}.layout does not fit the plan's inputs: {problems[0]}; "
                                    "regenerate the plan with 'autoplan plan --out'")

    @classmethod
    def from_json(cls, text: str) -> "PlanFile":
        """Strict JSON (``hardware_specs.files.parse_json``: finite numbers, bounded nesting)."""
        return cls.from_dict(parse_json(text, origin="plan", error=PlanFileError))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "inputs": self.inputs.to_dict(),
            "inputs_digest": self.inputs_digest,
            "best": self.best.to_dict() if self.best else None,
            "candidates": [c.to_dict() for c in self.candidates],
            "search": self.search.to_dict(),
        }
        if self.closest_misses:
            out["closest_misses"] = [m.to_dict() for m in self.closest_misses]
        if self.no_fit is not None:
            out["no_fit"] = self.no_fit.to_dict()
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out

    def to_json(self) -> str:
        """Stable JSON: sorted keys, fixed indentation; byte-identical for the same plan."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    def with_best(self, best: PlanEntry) -> "PlanFile":
        """This plan file with ``best`` as its only plan (what ``validate`` launches one by one)."""
        return replace(self, best=best, candidates=())


def read_plan_file(path: str | Path) -> PlanFile:
    """The plan file at ``path``; anything else is one ``PlanFileError`` line naming the file."""
    shown = f"plan file {json.dumps(str(path))}"
    raw = read_json(path, what="plan file", error=PlanFileError, max_bytes=MAX_PLAN_FILE_BYTES)
    try:
        return PlanFile.from_dict(raw)
    except PlanFileError as err:
        raise PlanFileError(f"{shown}: {err}") from None
