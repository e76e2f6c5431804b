"""Layers per pipeline chunk: the forms frameworks use to state an uneven split.

A split lists the layers of each of the pp · v model chunks in pipeline order (chunk c of rank i
is model stage c·pp + i, as in ``assignment.py``). Two published forms map onto it:

- Megatron-LM's ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``:
  layers on the first / last pipeline *rank*, over all of its v chunks (each of which takes an equal
  share, so the count must divide by v); the middle ranks split the rest equally
  (``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build`` and
  ``transformer_config.py``'s uneven-PP checks, NVIDIA/Megatron-LM commit d98e8a64).
- torchtitan's ``pipeline_parallel_first_stage_less_layers`` / ``..._last_stage_less_layers``:
  the embedding and the head count as that many layers on the first and last chunk, and the
  weighted total is split as evenly as possible (``torchtitan/distributed/pipeline_parallel.py``,
  pytorch/torchtitan commit b5bcd76c).
"""

from __future__ import annotations

from autoplan_base.errors import SpecError, field


class StageSplitError(SpecError):
    """Stage sizes that do not make a split of the model's layers."""


def balanced_split(num_layers: int, num_chunks: int) -> tuple[int, ...]:
    """Layers per chunk as even as possible; the first ``num_layers mod num_chunks`` take one more."""
    per, rest = divmod(num_layers, num_chunks)
    return tuple(per + (1 if i < rest else 0) for i in range(num_chunks))


def chunk_order(pp: int, virtual_stages: int) -> list[list[int]]:
    """Model-chunk indices held by each pipeline rank: rank i holds chunks i, i + pp, ..."""
    return [list(range(i, pp * virtual_stages, pp)) for i in range(pp)]


V_SCHEDULES: tuple[str, ...] = ("zb-v", "dualpipe-v")
"""Schedules that place a rank's two chunks in a V: rank i holds model chunks i and 2·pp − 1 − i
(Qi et al. 2024, ZB-V, Sec. 6; torch's ``generate_stage_to_rank_mapping(style="v")``)."""


def rank_chunks(schedule: str, pp: int, virtual_stages: int) -> list[list[int]]:
    """Model-chunk indices each pipeline rank holds, in its local order, by the schedule's placement.

    Looped (GPipe, 1F1B, interleaved, ZB-H1, interleaved ZB): rank i holds i, i + pp, ...
    V (ZB-V, DualPipeV): rank i holds i and 2·pp − 1 − i, so rank 0 holds the first and the last chunk.
    DualPipe (DeepSeek-V3 report, Sec. 3.2.1): the model is cut into pp chunks and rank i holds chunk i
    and chunk pp − 1 − i, one per direction: two copies of the parameters over the pipeline."""
    if schedule in V_SCHEDULES:
        return [[i, 2 * pp - 1 - i] for i in range(pp)]
    if schedule == "dualpipe" and pp > 1:
        return [[i, pp - 1 - i] for i in range(pp)]
    return chunk_order(pp, virtual_stages)


def check_requested_split(model_name: str, num_layers: int, layers_per_chunk: tuple[int, ...],
                          first: int | None, last: int | None) -> None:
    """Refuse, naming the option, a split a search is asked to keep that no pipeline of the model can
    take: chunk counts that are not positive integers or do not add up to the model's layers, or a
    first or last rank that would hold every layer (another rank needs at least one)."""
    if layers_per_chunk:
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in layers_per_chunk):
            raise StageSplitError(f"{field('layers_per_chunk', ','.join(map(str, layers_per_chunk)))}: every chunk "
                                  "needs a whole number of layers, at least one")
        if sum(layers_per_chunk) != num_layers:
            raise StageSplitError(f"{field('layers_per_chunk', ','.join(map(str, layers_per_chunk)))} adds up to "
                                  f"{sum(layers_per_chunk)} layers; {model_name} has {num_layers}: list counts that "
                                  f"sum to {num_layers}")
    for name, value in (("first_stage_layers", first), ("last_stage_layers", last)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 1 <= value <= num_layers - 1):
            raise StageSplitError(f"{field(name, value)} must be a whole number from 1 to {num_layers - 1} "
                                  f"({model_name} has {num_layers} layers, and the other pipeline ranks need one each)")
    if first is not None and last is not None and first + last > num_layers:
        raise StageSplitError(f"{field('first_stage_layers', first)} + {field('last_stage_layers', last)} is "
                              f"{first + last}; {model_name} has {num_layers} layers")


def first_last_split(num_layers: int, pp: int, virtual_stages: int, first: int | None,
                     last: int | None) -> tuple[int, ...]:
    """Megatron's uneven form as layers per chunk: ``first`` (``last``) layers on the first (last)
    pipeline rank, spread evenly over its chunks; the middle ranks share the rest equally."""
    per_rank: list[int | None] = [None] * pp
    rest, middle = num_layers, pp
    for name, index, value in (("first_stage_layers", 0, first), ("last_stage_layers", pp - 1, last)):
        if value is None:
            continue
        if value < virtual_stages or value % virtual_stages:
            raise StageSplitError(f"{field(name, value)} must be a positive multiple of the {virtual_stages} "
                                  "virtual stages (each chunk of that rank takes an equal share)")
        if per_rank[index] is not None:
            raise StageSplitError(f"{field('first_stage_layers')} and {field('last_stage_layers')} need pp > 1")
        per_rank[index] = value
        rest, middle = rest - value, middle - 1
    if middle:
        if rest < middle * virtual_stages:
            raise StageSplitError(f"{field('first_stage_layers')} / {field('last_stage_layers')} leave {rest} of the {num_layers} "
                                  f"layers for the other {middle} pipeline ranks; they need at least "
                                  f"{middle * virtual_stages}")
        if rest % (middle * virtual_stages):
            raise StageSplitError(f"the {rest} layers left for the {middle} middle pipeline ranks do not split "
                                  f"evenly over their {middle * virtual_stages} chunks; adjust "
                                  f"{field('first_stage_layers')} / {field('last_stage_layers')}")
        per_rank = [rest // middle if n is None else n for n in per_rank]
    elif rest:
        raise StageSplitError(f"{field('first_stage_layers')} + {field('last_stage_layers')} must sum to {num_layers} at pp {pp}")
    counts = [0] * (pp * virtual_stages)
    for rank, chunks in enumerate(chunk_order(pp, virtual_stages)):
        for c in chunks:
            counts[c] = per_rank[rank] // virtual_stages
    return tuple(counts)


def megatron_first_last(counts: tuple[int, ...], pp: int, virtual_stages: int) -> tuple[int, int] | None:
    """(first-rank layers, last-rank layers) when ``counts`` is in Megatron's uneven form, else None."""
    ranks = [[counts[c] for c in chunks] for chunks in chunk_order(pp, virtual_stages)]
    if pp < 2 or any(len(set(r)) > 1 for r in ranks) or len({r[0] for r in ranks[1:-1]}) > 1:
        return None
    return sum(ranks[0]), sum(ranks[-1])


def weighted_split(num_layers: int, num_chunks: int, first_less: int, last_less: int) -> tuple[int, ...] | None:
    """torchtitan's form: the embedding weighs ``first_less`` layers on the first chunk and the head
    ``last_less`` on the last; the weighted total is split evenly (first chunks take the remainder).
    None when a chunk would be left with no layer."""
    counts = list(balanced_split(num_layers + first_less + last_less, num_chunks))
    counts[0] -= first_less
    counts[-1] -= last_less
    return tuple(counts) if min(counts) >= 1 else None


def describe_split(counts: tuple[int, ...]) -> str:
    """Run-length text of a split: (3, 4, 4, 4, 3) -> ``3,4x3,3``."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def parse_layers(text: str) -> tuple[int, ...]:
    """``"7,8,8,7"`` -> (7, 8, 8, 7), also in the run-length form ``describe_split`` prints:
    ``"3,4x3,3"`` -> (3, 4, 4, 4, 3); a clear error naming the option otherwise."""
    try:
        counts = tuple(n for part in text.split(",") for n in _run(part))
    except ValueError:
        raise StageSplitError(f"{field('layers_per_chunk', repr(text))}: give comma-separated layer counts, "
                              "one per pipeline chunk, e.g. 7,8,8,7 or 7,8x2,7 (NxK: N layers on K chunks)") from None
    if min(counts) < 1:
        raise StageSplitError(f"{field('layers_per_chunk', repr(text))}: every chunk needs at least one layer")
    return counts


def _run(part: str) -> tuple[int, ...]:
    """One item of a split: ``"8"`` -> (8,); ``"8x3"`` -> (8, 8, 8). ValueError when malformed."""
    layers, times, repeat = part.strip().partition("x")
    num_chunks = int(repeat) if times else 1
    if num_chunks < 1:
        raise ValueError(part)
    return (int(layers),) * num_chunks
