"""What the harness measures: GEMM and attention shapes, buffer sizes, repeats. Pure.

GEMM shapes are the four weight matmuls of a transformer layer (QKV, attention output, MLP up,
MLP down) and, in the full profile, their backward matmuls (input and weight gradients), for
layer widths of the model families autoplan ships presets for, whole and as one tensor-parallel
rank holds them (``TP_DEGREES``). A family too big for the device's time budget is scaled down
by powers of two until one layer's largest GEMM fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hardware_specs.units import KIB, MIB

Shape = tuple[int, int, int]
"""(m, n, k) of an (m×k)·(k×n) matmul."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWidths:
    """The matmul widths of one transformer layer."""

    hidden: int
    ffn: int
    q_dim: int
    kv_dim: int
    gated: bool

    def forward_gemms(self, tokens: int) -> list[Shape]:
        """QKV, attention output, MLP up (gate and up fused when gated), MLP down."""
        up = 2 * self.ffn if self.gated else self.ffn
        t, h = tokens, self.hidden
        return [(t, self.q_dim + 2 * self.kv_dim, h), (t, h, self.q_dim), (t, up, h), (t, h, self.ffn)]

    def sharded(self, tp: int) -> "LayerWidths":
        """The widths one of ``tp`` tensor-parallel ranks multiplies (Shoeybi et al. 2019, sec. 3):
        QKV and MLP-up split by columns, attention-output and MLP-down by rows, so the head
        widths and the MLP width shrink by ``tp`` and the hidden size stays whole."""
        return LayerWidths(hidden=self.hidden, ffn=self.ffn // tp, q_dim=self.q_dim // tp,
                           kv_dim=self.kv_dim // tp, gated=self.gated)

    def scaled(self, factor: int) -> "LayerWidths":
        """Every width divided by ``factor`` (a power of two)."""
        return LayerWidths(hidden=self.hidden // factor, ffn=self.ffn // factor, q_dim=self.q_dim // factor,
                           kv_dim=max(self.kv_dim // factor, 64), gated=self.gated)


LAYER_FAMILIES: tuple[LayerWidths, ...] = (
    # tiny-llama preset (costmodels.presets): h 256, f 768, 8 heads, 4 kv heads of 32.
    LayerWidths(hidden=256, ffn=768, q_dim=256, kv_dim=128, gated=True),
    # GPT-3 1.3B (Brown et al. 2020, Table 2.1): h 2048, f 4h, multi-head attention.
    LayerWidths(hidden=2048, ffn=8192, q_dim=2048, kv_dim=2048, gated=False),
    # Llama 3 8B (Dubey et al. 2024, Table 3): h 4096, f 14336, 8 kv heads of 128.
    LayerWidths(hidden=4096, ffn=14336, q_dim=4096, kv_dim=1024, gated=True),
    # Llama 3 70B (same table): h 8192, f 28672, 8 kv heads of 128.
    LayerWidths(hidden=8192, ffn=28672, q_dim=8192, kv_dim=1024, gated=True),
)


TP_DEGREES: tuple[int, ...] = (1, 2, 4, 8)
"""Tensor-parallel degrees whose per-rank layer GEMMs the GPU profile measures."""
MIN_SHARDED_WIDTH = 64
"""A sharded family is measured only while every sharded width stays at least this wide."""


def backward_gemms(shape: Shape) -> list[Shape]:
    """Input gradient (m×n)·(n×k) and weight gradient (k×m)·(m×n) of a forward (m, n, k)."""
    m, n, k = shape
    return [(m, k, n), (k, n, m)]


def fit_family(family: LayerWidths, tokens: int, budget_flops: float) -> LayerWidths:
    """``family`` divided by the smallest power of two that brings its largest forward GEMM
    at ``tokens`` tokens under ``budget_flops`` (never below a hidden size of 128)."""
    factor = 1
    while family.hidden // factor > 128:
        if max(2.0 * m * n * k for m, n, k in family.scaled(factor).forward_gemms(tokens)) <= budget_flops:
            break
        factor *= 2
    return family.scaled(factor)


def sharded_families(tp_degrees: tuple[int, ...]) -> list[LayerWidths]:
    """Every family whole and as one rank of each degree in ``tp_degrees`` holds it."""
    out = []
    for family in LAYER_FAMILIES:
        for tp in tp_degrees:
            sharded = family.sharded(tp)
            if min(sharded.q_dim, sharded.kv_dim, sharded.ffn) >= MIN_SHARDED_WIDTH:
                out.append(sharded)
    return out


def gemm_shapes(tokens_list: tuple[int, ...], budget_flops: float, with_backward: bool,
                tp_degrees: tuple[int, ...] = (1,)) -> tuple[Shape, ...]:
    """Distinct GEMM shapes of every family (and its tp shards) at every token count, within
    the FLOP budget."""
    shapes: list[Shape] = []
    for tokens in tokens_list:
        for family in sharded_families(tp_degrees):
            for fwd in fit_family(family, tokens, budget_flops).forward_gemms(tokens):
                shapes.append(fwd)
                if with_backward:
                    shapes.extend(backward_gemms(fwd))
    return tuple(sorted({s for s in shapes if 2.0 * s[0] * s[1] * s[2] <= budget_flops}))


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasurePlan:
    """Everything one profiling run measures, and how hard it tries."""

    gemm_shapes: tuple[Shape, ...]
    attention_shapes: tuple[tuple[int, int, int, int], ...]
    """(batch, seq_len, num_heads, head_dim)."""
    memory_sizes_bytes: tuple[int, ...]
    collective_sizes_bytes: tuple[int, ...]
    """Increasing: √2 steps in the full profile (``sqrt2_steps``), powers of two in the quick one."""
    min_repeats: int
    max_repeats: int
    time_budget_s: float
    """Target seconds of timed repeats per measured point and round (after warm-up)."""
    rounds: int
    """Sweeps over every point; a point's time is the median of its per-round medians (and, for
    compute, of every rank's), so a burst of load from other processes spoils one round of a
    point, not the point."""
    comm_rounds: int
    """Sweeps over every collective and size (cheaper than compute rounds, and collectives on a
    shared host jitter more, so there are more of them)."""
    flush_bytes: int
    """GEMM operands and memory-kernel buffers rotate through copies covering at least this many
    bytes, so no timed call finds its operands in the cache the previous call filled (0: one copy)."""
    burn_in_s: float
    """Seconds of back-to-back large GEMMs before the first timed point, so clocks and power
    settle where a training run holds them, and the rate they keep is measured against a burst
    before (``bench_compute.sustained_burn_in``): long enough for a power-capped part to settle
    (an H100's bf16 GEMM loop does within about 4 s)."""


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """low, 2·low, 4·low, ... up to and including high."""
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= 2
    return tuple(out)


COLLECTIVE_SIZE_QUANTUM_BYTES = 256
"""Collective sizes are rounded to a multiple of this, so every size splits evenly into the shards
of a group of up to 64 fp32 (128 bf16) ranks (all-gather, reduce-scatter, all-to-all)."""


def sqrt2_steps(low: int, high: int) -> tuple[int, ...]:
    """low, √2·low, 2·low, 2√2·low, ... up to and including high, each rounded to a multiple of
    ``COLLECTIVE_SIZE_QUANTUM_BYTES`` (the powers of two among them stay exact). Twice as many
    sizes per octave as ``powers_of_two``: a regime change is then located within a factor √2,
    and every other size can be held out of a fit and still leave a regime its three points."""
    out: list[int] = []
    k = 0
    while True:
        size = round(low * 2 ** (k / 2) / COLLECTIVE_SIZE_QUANTUM_BYTES) * COLLECTIVE_SIZE_QUANTUM_BYTES
        if size > high:
            return tuple(out)
        out.append(size)
        k += 1


def make_plan(device_type: str, quick: bool) -> MeasurePlan:
    """The measurement plan for ``cpu`` or ``cuda``; ``quick`` trades coverage for time.

    On GPU the operands rotate through 256 MiB, twice the largest L2 of the GPUs in
    ``hardware_specs`` (B200: 126 MB, Chips and Cheese's "Nvidia's B200" article; H100: 50 MB),
    and the run burns in first; the CPU plan keeps one copy
    (its figures are the in-cache rates ``docs/profiling.md`` reports) and no burn-in.
    """
    cuda = device_type == "cuda"
    budget_flops = (4e12 if cuda else 2e9) / (4 if quick else 1)
    tokens = (1024, 4096, 16384) if cuda else (128, 512, 2048)
    if not quick:
        tokens = tuple(sorted({*tokens, *(t * 2 for t in tokens)}))
    heads = 16 if cuda else 4
    seqs = (1024, 2048, 4096, 8192) if cuda else (256, 512, 1024)
    if not quick:
        seqs = tuple(sorted({seqs[0] // 2, *seqs, seqs[-1] * 2}))
    attention_budget = budget_flops * 4
    attention = tuple((1, s, heads, d) for s in seqs for d in (64, 128)
                      if 12.0 * s * s * heads * d <= attention_budget)
    top_memory = (1024 if cuda else 64) * MIB * (1 if quick else 4)
    top_collective = (256 if cuda else 16) * MIB * (1 if quick else 16)
    return MeasurePlan(
        gemm_shapes=gemm_shapes(tokens, budget_flops, with_backward=not quick,
                                tp_degrees=TP_DEGREES if cuda else (1,)),
        attention_shapes=attention,
        memory_sizes_bytes=powers_of_two(top_memory // 64, top_memory)[::2] if quick
        else powers_of_two(top_memory // 256, top_memory)[::2],
        collective_sizes_bytes=powers_of_two(4 * KIB, top_collective) if quick
        else sqrt2_steps(4 * KIB, top_collective),
        min_repeats=3 if quick else 5,
        max_repeats=20 if quick else 50,
        time_budget_s=0.03 if quick else 0.1,
        rounds=1 if quick else 3,
        comm_rounds=2 if quick else 6,
        flush_bytes=256 * MIB if cuda else 0,
        burn_in_s=(8.0 if quick else 15.0) if cuda else 0.0,
    )


def fit_to_memory(plan: MeasurePlan, memory_bytes: int) -> MeasurePlan:
    """``plan`` without buffers above 1/16 of device memory (a collective holds up to three
    buffers of its size at once, a copy two; the rest is headroom for the runtime)."""
    cap = memory_bytes // 16
    return replace(plan, memory_sizes_bytes=tuple(s for s in plan.memory_sizes_bytes if s <= cap),
                   collective_sizes_bytes=tuple(s for s in plan.collective_sizes_bytes if s <= cap))


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLayout:
    """A partition of all ranks into equal process groups, measured concurrently."""

    num_ranks: int
    """Ranks per group."""
    ranks_per_node: int
    """Most ranks of one group on one node (ranks fill nodes in order)."""
    num_nodes: int
    """Nodes one group spans."""
    groups: tuple[tuple[int, ...], ...]

    @property
    def spans_nodes(self) -> bool:
        return self.num_nodes > 1


def _partition(world: int, size: int, stride: int) -> tuple[tuple[int, ...], ...]:
    """Groups of ``size`` ranks ``stride`` apart covering 0..world-1 (stride 1: contiguous)."""
    starts = [b * size * stride + i for b in range(world // (size * stride)) for i in range(stride)]
    return tuple(tuple(s + j * stride for j in range(size)) for s in starts)


def placement(group: tuple[int, ...], ranks_per_node: int) -> tuple[int, int]:
    """(most ranks of ``group`` on one node, nodes it spans), ranks filling nodes in order."""
    nodes = [r // ranks_per_node for r in group]
    return max(nodes.count(n) for n in set(nodes)), len(set(nodes))


def _layouts(world: int, ranks_per_node: int) -> list[tuple[int, GroupLayout]]:
    """(stride, layout) for every divisor size >= 2 and both strides, in measuring order."""
    out = []
    for size in range(2, world + 1):
        if world % size:
            continue
        for stride in (1, world // size):
            groups = _partition(world, size, stride)
            placements = {placement(g, ranks_per_node) for g in groups}
            assert len(placements) == 1, f"groups of {size} at stride {stride} are placed unequally"
            ((per_node, nodes),) = placements
            out.append((stride, GroupLayout(num_ranks=size, ranks_per_node=per_node, num_nodes=nodes,
                                            groups=groups)))
    return out


def group_layouts(world: int, ranks_per_node: int) -> tuple[GroupLayout, ...]:
    """Every group size the world allows (each divisor >= 2), placed inside a node (contiguous
    ranks) and, on several nodes, across nodes (ranks ``world/size`` apart, one per node where
    possible). A layout is keyed, and measured once, by (size, ranks per node, nodes)."""
    layouts: dict[tuple[int, int, int], GroupLayout] = {}
    for _, layout in _layouts(world, ranks_per_node):
        layouts.setdefault((layout.num_ranks, layout.ranks_per_node, layout.num_nodes), layout)
    return tuple(layouts[key] for key in sorted(layouts))


def legacy_placement(world: int, ranks_per_node: int, num_ranks: int, spans_nodes: bool) -> tuple[int, int] | None:
    """(ranks per node, nodes) of the layout a schema-1/2 harness measured as (``num_ranks``,
    ``spans_nodes``): the first stride, 1 then ``world/size``, whose groups matched; None if none."""
    for _, layout in _layouts(world, ranks_per_node):
        if (layout.num_ranks, layout.spans_nodes) == (num_ranks, spans_nodes):
            return layout.ranks_per_node, layout.num_nodes
    return None
