"""Cases of ``plan`` / ``evaluate`` that ``tests/test_behaviour_cases.py`` checks: one per feature
(every ZeRO stage, schedule, recomputation mode, runtime, precision, a measured profile, an HF
config, a job that does not fit). Each is cheap (small GPU counts or tiny models).

Paths in inputs are relative to the repository root (the profile path is recorded in the plan's
inputs); ``case_json`` changes directory itself.

``python tests/behaviour_cases.py NAME...`` prints the figures of the named cases, to read before
updating ``EXPECTED`` in the test after an intended change of the cost model.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PLAN_BYTES = Path(__file__).resolve().parent / "data" / "plan_bytes"
PROFILE = "profiles/data/cpu-gloo-2proc.json"
HF_CONFIG = "tests/data/hf-small-llama/config.json"

Case = tuple[str, str, dict[str, Any]]
"""(name, "plan" or "evaluate", keyword arguments; for evaluate, ``layout`` is a dict)."""


def _plan_cases() -> list[Case]:
    h100 = {"hardware": "h100-sxm-80gb", "seq_len": 2048}
    cpu = {"model": "tiny-llama", "hardware": "cpu", "gpus": 2, "global_batch": 8, "seq_len": 128}
    cases: list[Case] = [
        ("plan-gpt3-1.3b-a100-8", "plan", {"model": "gpt3-1.3b", "hardware": "a100-sxm-80gb", "gpus": 8,
                                           "global_batch": 64, "seq_len": 2048}),
        ("plan-llama3-8b-h100-8-torch", "plan", {**h100, "model": "llama3-8b", "gpus": 8, "global_batch": 32,
                                                 "runtime": "torch"}),
        ("plan-llama3-8b-h100-8-megatron", "plan", {**h100, "model": "llama3-8b", "gpus": 8, "global_batch": 32}),
        # LoRA: autoplan's own job trains adapters; Megatron-LM's pretrain_gpt.py does not (plan refuses it)
        ("plan-llama3-8b-h100-8-lora", "plan", {**h100, "model": "llama3-8b", "gpus": 8, "global_batch": 32,
                                                "lora_rank": 16, "runtime": "torch"}),
        ("plan-llama3-8b-h100-8-fp8", "plan", {**h100, "model": "llama3-8b", "gpus": 8, "global_batch": 32,
                                               "precision": "fp8"}),
        ("plan-mixtral-8x7b-h100-16", "plan", {**h100, "model": "mixtral-8x7b", "gpus": 16, "global_batch": 32,
                                               "top_k": 3}),
        ("plan-llama2-7b-v100-8-fp16-sgd", "plan", {"model": "llama2-7b", "hardware": "v100-sxm-32gb", "gpus": 8,
                                                    "global_batch": 16, "seq_len": 1024, "precision": "fp16",
                                                    "optimizer": "sgd"}),
        ("plan-gpt3-175b-a100-8-nofit", "plan", {"model": "gpt3-175b", "hardware": "a100-sxm-40gb", "gpus": 8,
                                                 "global_batch": 8, "seq_len": 2048}),
        ("plan-hf-config-a100-4", "plan", {"model": HF_CONFIG, "hardware": "a100-sxm-80gb", "gpus": 4,
                                           "global_batch": 16, "seq_len": 512}),
        ("plan-tiny-cpu-profile-torch", "plan", {**cpu, "profile": PROFILE, "runtime": "torch"}),
        ("plan-tiny-cpu-profile-megatron", "plan", {**cpu, "profile": PROFILE}),
        ("plan-tiny-cpu-fp32-profile", "plan", {**cpu, "profile": PROFILE, "precision": "fp32", "runtime": "torch"}),
        ("plan-tiny-cpu-fp32", "plan", {**cpu, "precision": "fp32"}),
        ("plan-tiny-mixtral-cpu-profile", "plan", {**cpu, "model": "tiny-mixtral", "profile": PROFILE}),
        ("plan-tiny-gpt-cpu-eager", "plan", {**cpu, "model": "tiny-gpt", "attention": "eager", "runtime": "torch"}),
    ]
    # No ``launchable`` case: the structure-plan branch fixes which layouts it returns (issue #10).
    return cases


def _layouts() -> list[tuple[str, dict[str, Any]]]:
    """Layouts for llama2-7b on 16 H100 with global batch 32, one per feature."""
    out = []
    for zero in (0, 1, 2, 3):
        out.append((f"dp16-zero{zero}", {"dp": 16, "zero_stage": zero, "num_microbatches": 2}))
        out.append((f"dp4-tp2-pp2-zero{zero}", {"dp": 4, "tp": 2, "pp": 2, "zero_stage": zero,
                                                "num_microbatches": 8, "sequence_parallel": True}))
    for schedule in ("gpipe", "1f1b"):
        out.append((f"dp2-pp8-{schedule}", {"dp": 2, "pp": 8, "schedule": schedule, "num_microbatches": 16}))
    out.append(("dp2-pp4-interleaved-v2", {"dp": 2, "pp": 4, "tp": 2, "schedule": "interleaved",
                                           "virtual_stages": 2, "num_microbatches": 16, "sequence_parallel": True}))
    out.append(("dp2-pp4-uneven", {"dp": 2, "pp": 4, "tp": 2, "num_microbatches": 16,
                                   "layers_per_chunk": (7, 9, 9, 7)}))
    for recompute in ("selective", "full"):
        out.append((f"tp8-dp2-recompute-{recompute}", {"dp": 2, "tp": 8, "recompute": recompute,
                                                       "num_microbatches": 16, "micro_batch_size": 1}))
    out.append(("pp4-recompute-2-layers", {"dp": 1, "tp": 4, "pp": 4, "recompute": "full",
                                           "recompute_num_layers": 2, "num_microbatches": 32}))
    out.append(("dp8-cp2", {"dp": 8, "cp": 2, "num_microbatches": 4}))
    out.append(("dp16-zero3-hsdp8", {"dp": 16, "zero_stage": 3, "hsdp_shard_degree": 8, "num_microbatches": 2}))
    out.append(("dp16-zero1-offload", {"dp": 16, "zero_stage": 1, "optimizer_offload": True,
                                       "num_microbatches": 2}))
    out.append(("dp4-tp4-mb2-no-sp", {"dp": 4, "tp": 4, "micro_batch_size": 2, "num_microbatches": 4}))
    return out


def _evaluate_cases() -> list[Case]:
    base = {"model": "llama2-7b", "hardware": "h100-sxm-80gb", "gpus": 16, "global_batch": 32, "seq_len": 2048}
    cases: list[Case] = []
    for runtime in ("megatron", "torch"):
        for name, layout in _layouts():
            cases.append((f"eval-llama2-7b-{name}-{runtime}", "evaluate", {**base, "runtime": runtime,
                                                                           "layout": layout}))
    moe = {"model": "mixtral-8x7b", "hardware": "h100-sxm-80gb", "gpus": 16, "global_batch": 32, "seq_len": 2048}
    cases += [
        ("eval-mixtral-ep8-zero1", "evaluate", {**moe, "layout": {"dp": 8, "tp": 2, "ep": 8, "zero_stage": 1,
                                                                  "num_microbatches": 4,
                                                                  "sequence_parallel": True}}),
        ("eval-mixtral-ep4-pp2-zero3-torch", "evaluate", {**moe, "runtime": "torch", "layout": {
            "dp": 4, "tp": 2, "pp": 2, "ep": 4, "zero_stage": 3, "num_microbatches": 8}}),
        ("eval-llama3-8b-lora-dp8", "evaluate", {"model": "llama3-8b", "hardware": "a100-sxm-80gb", "gpus": 8,
                                                 "global_batch": 16, "seq_len": 1024, "lora_rank": 8,
                                                 "layout": {"dp": 8, "zero_stage": 2, "num_microbatches": 2}}),
        ("eval-llama3-8b-fp8-tp2", "evaluate", {"model": "llama3-8b", "hardware": "h100-sxm-80gb", "gpus": 8,
                                                "global_batch": 16, "seq_len": 1024, "precision": "fp8",
                                                "layout": {"dp": 4, "tp": 2, "num_microbatches": 4,
                                                           "sequence_parallel": True}}),
        ("eval-tiny-cpu-fp32-profile-dp2", "evaluate", {"model": "tiny-llama", "hardware": "cpu", "gpus": 2,
                                                        "global_batch": 8, "seq_len": 128, "precision": "fp32",
                                                        "profile": PROFILE, "runtime": "torch",
                                                        "layout": {"dp": 2, "zero_stage": 3,
                                                                   "num_microbatches": 2, "micro_batch_size": 2}}),
        ("eval-tiny-cpu-profile-tp2", "evaluate", {"model": "tiny-llama", "hardware": "cpu", "gpus": 2,
                                                   "global_batch": 8, "seq_len": 128, "profile": PROFILE,
                                                   "layout": {"tp": 2, "num_microbatches": 8}}),
        ("eval-tiny-cpu-profile-pp2", "evaluate", {"model": "tiny-llama", "hardware": "cpu", "gpus": 2,
                                                   "global_batch": 8, "seq_len": 128, "profile": PROFILE,
                                                   "runtime": "torch", "layout": {"pp": 2, "num_microbatches": 8}}),
        ("eval-hf-config-tp2-pp2", "evaluate", {"model": HF_CONFIG, "hardware": "a100-sxm-80gb", "gpus": 4,
                                                "global_batch": 16, "seq_len": 512,
                                                "layout": {"tp": 2, "pp": 2, "num_microbatches": 16}}),
    ]
    return cases


def cases() -> list[Case]:
    return _plan_cases() + _evaluate_cases()


def case_json(kind: str, kwargs: dict[str, Any]) -> str:
    """The JSON document ``autoplan plan --format json`` / ``autoplan evaluate --format json`` prints."""
    from costmodels.layout import Layout
    from planner import api
    from planner.plan.report import plan_entry

    here = os.getcwd()
    os.chdir(REPO)
    try:
        if kind == "plan":
            return api.plan(**kwargs).to_json()
        kwargs = dict(kwargs)
        raw = dict(kwargs.pop("layout"))
        raw.setdefault("micro_batch_size", 1)
        layout = Layout(**raw)
        return json.dumps(plan_entry(api.evaluate(layout=layout, **kwargs)).to_dict(), indent=2, sort_keys=True) + "\n"
    finally:
        os.chdir(here)


def main(names: list[str]) -> None:
    wanted = set(names)
    for name, kind, kwargs in cases():
        if not wanted or name in wanted:
            doc = json.loads(case_json(kind, kwargs))
            entry = doc.get("best", doc) if kind == "plan" else doc
            print(name, json.dumps(entry and entry["predicted"] and {
                k: entry["predicted"][k] for k in ("step_time_s", "peak_memory_gib", "mfu", "fits")}))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
