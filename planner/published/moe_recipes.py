"""How Megatron-Bridge's performance recipes ran the published MoE rows: rack placement, token
dispatcher and EP overlap, none of which the rows state.

- Placement: Megatron-Bridge's Slurm launcher allocates GB200/GB300 jobs in ``--segment``s of equal
  size, the largest tray count of at most one rack that divides the job's trays
  (``scripts/performance/utils/executors.py``, from v0.2.1 on; its v0.6.0 recipes also name
  ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`` 64 with ``NVLINK_DOMAIN_SIZE`` 72): a 256-GPU row
  uses 64 GPUs of each of four racks (``hardware_specs.placement.even_split_gpus``).
- Dispatcher and EP overlap: the workload presets of Megatron-Bridge v0.5.0 (the 26.06 container;
  ``scripts/performance/configs/{deepseek,qwen,gpt_oss}/*_workload_base_configs.py``, fields
  ``moe_flex_dispatcher_backend`` and ``moe_a2a_overlap``), keyed by the preset's layout, so a row
  takes them only where it ran that layout. Other releases' presets of the same layout are taken
  to match (recorded per row as assumed).
"""

from __future__ import annotations

from dataclasses import replace

from costmodels.layout import Layout, ep_overlap_runs
from hardware_specs import NodeSpec
from hardware_specs.placement import even_split_gpus

NEMO_MOE_COMM: dict[tuple[str, str, str, int, int, int, int], tuple[str, bool]] = {
    # (row model, GPU preset, precision, tp, pp, virtual stages, ep): (dispatcher, EP overlap)
    ("DeepSeekV3", "gb200-nvl72", "mxfp8", 1, 4, 4, 64): ("hybridep", True),  # GB200_FP8_MX_V2
    ("DeepSeekV3", "gb200-nvl72", "bf16", 1, 4, 4, 64): ("hybridep", False),  # GB200_BF16_V2
    ("DeepSeekV3", "gb300-nvl72", "mxfp8", 1, 2, 8, 32): ("hybridep", True),  # GB300_FP8_MX_V2
    ("DeepSeekV3", "b200", "mxfp8", 1, 8, 2, 32): ("deepep", True),  # B200_FP8_MX_V2
    ("DeepSeekV3", "b200", "mxfp8", 1, 16, 1, 8): ("hybridep", False),  # B200_FP8_CS_V2 layout
    ("DeepSeekV3", "b300", "mxfp8", 1, 8, 1, 8): ("hybridep", False),  # B300_FP8_MX_V2
    ("DeepSeekV3", "b300", "mxfp8", 1, 16, 1, 8): ("hybridep", False),  # B300_FP8_MX_V1
    ("Qwen3_235B_a22B", "gb200-nvl72", "mxfp8", 1, 8, 3, 32): ("hybridep", True),  # GB200_FP8_MX_V2
    ("Qwen3_235B_a22B", "gb200-nvl72", "mxfp8", 1, 8, 1, 32): ("hybridep", False),  # GB200_FP8_CS_V2 layout
    ("Qwen3_235B_a22B", "gb300-nvl72", "mxfp8", 1, 4, 12, 32): ("hybridep", True),  # GB300_FP8_MX_V2
    ("Qwen3_235B_a22B", "gb300-nvl72", "mxfp8", 1, 4, 1, 32): ("hybridep", False),  # GB300_FP8_CS_V2 layout
    ("Qwen3_235B_a22B", "h100-sxm-80gb", "fp8", 2, 8, 4, 32): ("alltoall", True),  # H100_FP8_CS_V2
    ("Qwen3_235B_a22B", "b200", "mxfp8", 1, 8, 1, 8): ("alltoall", False),  # B200_FP8_MX_V2
    ("Qwen3_235B_a22B", "b300", "mxfp8", 1, 8, 1, 8): ("hybridep", False),  # B300_FP8_MX_V2
    ("Qwen3_30B_a3B", "gb200-nvl72", "mxfp8", 1, 1, 1, 8): ("hybridep", True),  # GB200_FP8_MX_V1
    ("Qwen3_30B_a3B", "gb300-nvl72", "mxfp8", 1, 1, 1, 8): ("hybridep", True),  # GB300_FP8_MX_V1
    ("Qwen3_30B_a3B", "b300", "mxfp8", 1, 1, 1, 8): ("hybridep", True),  # B300_FP8_MX_V1
    ("Qwen3_30B_a3B", "b200", "mxfp8", 1, 1, 1, 8): ("hybridep", False),  # B200_FP8_MX_V1
    ("Qwen3_30B_a3B", "h100-sxm-80gb", "fp8", 1, 1, 1, 16): ("hybridep", False),  # H100_FP8_CS_V1
    ("GPT OSS 120B", "gb200-nvl72", "mxfp8", 1, 1, 1, 64): ("hybridep", True),  # GB200_FP8_MX_V2
    ("GPT OSS 120B", "gb200-nvl72", "bf16", 1, 1, 1, 64): ("alltoall", True),  # GB200_BF16_V2
    ("GPT OSS 120B", "gb300-nvl72", "mxfp8", 1, 1, 1, 16): ("hybridep", True),  # GB300_FP8_MX_V2
    ("GPT OSS 120B", "gb300-nvl72", "bf16", 1, 1, 1, 64): ("alltoall", False),  # GB300_BF16_V2
    ("GPT OSS 120B", "b300", "mxfp8", 1, 1, 1, 8): ("hybridep", False),  # B300_FP8_MX_V2
    ("GPT OSS 120B", "b300", "bf16", 1, 1, 1, 8): ("hybridep", False),  # B300_BF16_V2
    ("GPT OSS 120B", "b200", "bf16", 1, 1, 1, 8): ("alltoall", False),  # B200_BF16_V2
    ("GPT OSS 120B", "h100-sxm-80gb", "bf16", 1, 4, 1, 8): ("alltoall", False),  # H100_BF16_V2
}
"""Megatron-Bridge v0.5.0's MoE dispatcher and A2A overlap per preset layout (module docstring);
a preset that sets no backend runs the alltoall dispatcher of its recipe."""


def recipe_placement(layout: Layout, node: NodeSpec, num_gpus: int) -> Layout:
    """``layout`` on Megatron-Bridge's segments (module docstring), on multi-node NVLink domains;
    unchanged where a node is its own domain or the job fits in one."""
    if node.nodes_per_nvlink_domain == 1 or num_gpus <= node.nvlink_domain_gpus:
        return layout
    even = even_split_gpus(node.nvlink_domain_gpus, node.gpus_per_node, num_gpus)
    return layout if even == node.nvlink_domain_gpus else replace(layout, gpus_per_nvlink_domain=even)


def recipe_moe_comm(model_name: str, preset: str, precision: str, layout: Layout) -> tuple[Layout, str] | None:
    """``layout`` with the dispatcher and EP overlap of the Megatron-Bridge preset it ran, and a
    note; None where no preset of that layout is known. The overlap is kept only where Megatron-
    Core runs it (pp 1 or interleaved, no full recomputation)."""
    L = layout
    found = NEMO_MOE_COMM.get((model_name, preset, precision, L.tp, L.pp, L.virtual_stages, L.ep))
    if found is None or L.ep == 1:
        return None
    dispatcher, overlap = found
    overlap = overlap and ep_overlap_runs(L.pp, L.schedule) and L.recompute != "full"
    note = (f"MoE dispatcher {dispatcher}, EP overlap {'on' if overlap else 'off'}: Megatron-Bridge v0.5.0's preset "
            f"of this layout (planner.published.moe_recipes.NEMO_MOE_COMM); the row does not state them")
    return replace(L, moe_dispatcher=dispatcher, ep_comm_overlap=overlap), note
