"""Search speed: median wall time and least process CPU time of ``planner.plan``, and layouts
evaluated, on the issue's two cases. On a machine shared with other jobs the wall time counts
their time too; the CPU time of this process does much less so.

(a) a 1T-parameter GPT (128 layers, h = 25600, 160 heads; Narayanan et al. SC'21, Table 1) on 3072
A100-80GB at global batch 3072, seq 2048; (b) llama3-405b on 16384 H100s at seq 8192 (global batch
2048 sequences = 16M tokens, Dubey et al. 2024). Run: ``.venv/bin/python benchmarks/search_speed.py``
(one process, so one core).
"""

from __future__ import annotations

import statistics
import time

import planner
from costmodels.model_spec import ModelSpec

GPT_1T = ModelSpec(name="gpt-1t", num_layers=128, hidden_size=25600, ffn_hidden_size=4 * 25600,
                   num_attention_heads=160, num_kv_heads=160, vocab_size=51200, tied_embeddings=True,
                   linear_bias=True)

CASES = {
    "gpt-1t on 3072 x a100-sxm-80gb": dict(model=GPT_1T, hardware="a100-sxm-80gb", gpus=3072, global_batch=3072,
                                           seq_len=2048),
    "llama3-405b on 16384 x h100-sxm-80gb": dict(model="llama3-405b", hardware="h100-sxm-80gb", gpus=16384,
                                                 global_batch=2048, seq_len=8192),
}


def main(repeats: int = 3) -> None:
    for name, case in CASES.items():
        seconds, cpu_seconds = [], []
        for _ in range(repeats):
            start, cpu_start = time.perf_counter(), time.process_time()
            report = planner.plan(**case)
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu_start)
        best = report.best
        print(f"{name}: median {statistics.median(seconds):.2f} s (least CPU {min(cpu_seconds):.2f} s) over "
              f"{repeats} runs; "
              f"space {report.search['space_size']:,} layouts, {report.search['evaluated']:,} evaluated in full; "
              f"best {best.layout.dp}x{best.layout.tp}x{best.layout.pp} (dp x tp x pp), cp {best.layout.cp}, "
              f"ZeRO-{best.layout.zero_stage}, step {best.step_time_s:.2f} s, MFU {best.mfu:.1%}")


if __name__ == "__main__":
    main()
