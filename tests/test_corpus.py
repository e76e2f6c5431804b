"""Behaviour unchanged by refactors: every case in ``tests/data/corpus`` regenerates byte for byte.

The corpus was recorded by ``tests/data/make_corpus.py`` before the cost model was split into
pure per-term functions. One field may differ, and only in cases run with a measured profile:
``sources`` (in ``predicted`` of every plan). It was wrong when recorded: the ``profile`` label of a
communication term stuck once any layout costed earlier in the same search had read the
profile (issue #10), so a layout could be labelled ``profile`` for a term whose rate it took from
the datasheet. Everything else, including every number, must match exactly.

Four plan cases (gpt3-1.3b-a100-8, llama3-8b-h100-8-lora, llama3-8b-h100-8-fp8, hf-config-a100-4)
were re-recorded when interleaved plans gained uneven chunks (issue #12, ``planner/search/stages.py``):
in each, only interleaved entries changed, now carrying ``layers_per_chunk`` and a shorter step;
every entry without the new field is byte-identical to the earlier recording.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))

import make_corpus  # noqa: E402

MAY_DIFFER_WITH_PROFILE = "sources"


def _without(value, key):
    if isinstance(value, dict):
        return {k: _without(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_without(v, key) for v in value]
    return value


@pytest.mark.parametrize("name,kind,kwargs", make_corpus.cases(), ids=[c[0] for c in make_corpus.cases()])
def test_corpus_case_is_unchanged(name, kind, kwargs):
    recorded = (make_corpus.CORPUS / f"{name}.json").read_text()
    now = make_corpus.case_json(kind, kwargs)
    if "profile" not in kwargs:
        assert now == recorded
        return
    assert json.dumps(_without(json.loads(now), MAY_DIFFER_WITH_PROFILE), sort_keys=True) == \
        json.dumps(_without(json.loads(recorded), MAY_DIFFER_WITH_PROFILE), sort_keys=True)


def test_corpus_is_large_and_covers_the_options():
    cases = make_corpus.cases()
    assert len(cases) >= 50
    assert len(list(make_corpus.CORPUS.glob("*.json"))) == len(cases)
    layouts = [k["layout"] for _, kind, k in cases if kind == "evaluate"]
    assert {l.get("zero_stage", 0) for l in layouts} == {0, 1, 2, 3}
    assert {l.get("schedule", "1f1b") for l in layouts} == {"gpipe", "1f1b", "interleaved"}
    assert {l.get("recompute", "none") for l in layouts} == {"none", "selective", "full"}
    assert {k.get("runtime", "megatron") for _, _, k in cases} == {"megatron", "torch"}
    assert {k.get("precision", "bf16") for _, _, k in cases} >= {"bf16", "fp8", "fp32", "fp16"}
