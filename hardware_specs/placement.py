"""How a job's ranks sit on rack-scale NVLink domains: how many GPUs of each domain it fills.

On GB200/GB300 NVL72 one NVLink domain is a rack of 18 four-GPU compute trays (72 GPUs). A job
takes whole trays, and ranks fill a domain in rank order before the next one, so the count of
GPUs it uses of each domain decides which process groups stay on NVLink: 128 ranks filling racks
72 at a time put ranks 64-71 of an EP-64 group in the first rack and 72-127 in the second, so that
group's all-to-all crosses the NICs; 64 GPUs of each rack keep it inside one.

Megatron-Bridge's performance launcher allocates such jobs in Slurm segments of equal size: the
largest tray count of at most one rack that divides the job's trays (``sbatch --segment``,
``scripts/performance/utils/executors.py`` at NVIDIA-NeMo/Megatron-Bridge 067f987d; 32 trays give
segments of 16 trays, 64 GPUs per rack, the "64 ranks per NVLink domain" of its MoE recipes).
``placement_choices`` offers that even split beside the fill-every-domain default; any other
whole number of trays is accepted when asked for (``check_gpus_per_domain``).

Pure functions of integers (``schema.ClusterSpec`` calls them), so nothing here imports the schema.
"""

from __future__ import annotations

from autoplan_base.errors import SpecError


def check_gpus_per_domain(value: object, *, domain_gpus: int, gpus_per_node: int, label: str) -> int:
    """``value`` as GPUs used of each NVLink domain: 0 (all of them) or a whole number of nodes
    (``gpus_per_node`` each) up to the domain's ``domain_gpus``. ``label`` names the input in the
    error (``--gpus-per-nvlink-domain 60``, ``gpus_per_nvlink_domain=60``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{label}: expected a whole number of GPUs, got {value!r}")
    if value == 0:
        return 0
    trays = domain_gpus // gpus_per_node
    if value < 0 or value % gpus_per_node or value > domain_gpus:
        raise SpecError(f"{label}: a job takes whole nodes of {gpus_per_node} GPUs, at most the NVLink domain's "
                        f"{domain_gpus}; use a multiple of {gpus_per_node} up to {domain_gpus} "
                        f"({trays} node{'s' * (trays != 1)}), or 0 for all of each domain")
    return value


def even_split_gpus(domain_gpus: int, gpus_per_node: int, num_gpus: int) -> int:
    """GPUs of each domain when the job's nodes are split into equal segments of at most one domain:
    the largest k <= domain_gpus / gpus_per_node dividing num_gpus / gpus_per_node, times
    gpus_per_node (Megatron-Bridge's ``--segment`` rule, module docstring)."""
    nodes, most = num_gpus // gpus_per_node, domain_gpus // gpus_per_node
    if nodes <= most:
        return nodes * gpus_per_node
    return next(k for k in range(most, 0, -1) if nodes % k == 0) * gpus_per_node


def placement_choices(domain_gpus: int, gpus_per_node: int, num_gpus: int) -> tuple[int, ...]:
    """The GPUs-per-domain values the search tries: 0 (fill every domain) and, where the job spans
    more than one multi-node domain and the even split differs from filling them, the even split."""
    if domain_gpus <= gpus_per_node or num_gpus <= domain_gpus:
        return (0,)
    even = even_split_gpus(domain_gpus, gpus_per_node, num_gpus)
    return (0,) if even == domain_gpus else (0, even)


def domain_sizes(num_gpus: int, per_domain: int) -> tuple[int, ...]:
    """GPUs of the job in each domain it touches, rank order: ``per_domain`` each, the rest last
    (128 GPUs at 72 per domain: (72, 56); at 64: (64, 64))."""
    full, rest = divmod(num_gpus, per_domain)
    return (per_domain,) * full + ((rest,) if rest else ())
