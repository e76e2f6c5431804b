"""The cost model's per-layer compute against the layers one H100 and one H200 ran.

Run: ``.venv/bin/python benchmarks/device_layers.py`` (a few seconds). For each measured shape
(``planner.published.device_records.LAYER_SHAPES``, sequence 4k and 8k, micro-batch 1) prints the
device's kernel floor, fused (``torch.compile``) and eager layer, and the model's per-layer forward
+ backward compute under ``--runtime megatron`` (as a share of the fastest measured way to run the
layer; the rule is >= 0.97) and under ``--runtime torch`` (as a share of the measured eager layer;
the rule is within +-15%). ``planner.published.device_layers`` has the method; ``tests/
test_device_layers.py`` holds both rules.
"""

from __future__ import annotations

import argparse
import statistics

from planner.published.device_layers import MEGATRON_FLOOR_SHARE, TORCH_EAGER_BAND, compare_layers
from planner.published.device_records import DEVICE_RECORD_NAMES, load_device_record


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    failures = 0
    for tag in DEVICE_RECORD_NAMES:
        record = load_device_record(tag)
        rows = compare_layers(record)
        print(f"{record.device} ({record.preset}, torch {record.torch_version}); times in ms, forward + backward")
        print(f"  {'shape':8} {'seq':>5} {'floor':>7} {'fused':>7} {'eager':>7} | {'megatron':>8} {'/fastest':>8} | "
              f"{'torch':>7} {'/eager':>7}")
        for r in rows:
            c = r.case
            ok_m = r.megatron_share_of_fastest >= MEGATRON_FLOOR_SHARE
            ok_t = abs(r.torch_share_of_eager - 1) <= TORCH_EAGER_BAND
            failures += (not ok_m) + (not ok_t)
            print(f"  {c.name:8} {c.seq_len:5} {_ms(c.kernel_floor_s):>7} {_ms(c.compiled_layer_s):>7} "
                  f"{_ms(c.eager_layer_s):>7} | {_ms(r.megatron_s):>8} {r.megatron_share_of_fastest:7.2f}"
                  f"{' ' if ok_m else '!'} | {_ms(r.torch_s):>7} {r.torch_share_of_eager:6.2f}{' ' if ok_t else '!'}")
        print(f"  median: megatron x{statistics.median(r.megatron_share_of_fastest for r in rows):.2f} of the "
              f"fastest measured layer, torch x{statistics.median(r.torch_share_of_eager for r in rows):.2f} of the "
              f"eager layer\n")
    print(f"rules: megatron >= {MEGATRON_FLOOR_SHARE} x the fastest measured layer; torch within "
          f"+-{TORCH_EAGER_BAND:.0%} of the eager layer; {failures} cell(s) outside ('!')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
