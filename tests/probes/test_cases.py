"""Every provider-response case in ../shared/cases/normalizer/ must normalize to its expected outcome."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from probes.anomalies import ANOMALY_KINDS
from probes.normalize import normalize_response

#: ``SPEC_AUDITOR_SHARED_CASES`` points at a ``shared/cases`` folder elsewhere (a clone that does
#: not sit beside ``shared/``); by default the folder beside the repository root is used.
_CASES_ROOT = Path(os.environ.get("SPEC_AUDITOR_SHARED_CASES") or Path(__file__).parents[2].parent / "shared" / "cases")
#: The folders whose cases the normalizer must pass: provider responses, and reasoning-model
#: responses (issue 35). Each folder is skipped on its own when it is absent.
CASE_FOLDERS = ("normalizer", "reasoning")
CASES_DIR = _CASES_ROOT / "normalizer"
CASE_FILES = [p for d in CASE_FOLDERS if (_CASES_ROOT / d).is_dir() for p in sorted((_CASES_ROOT / d).glob("*.json"))]

pytestmark = pytest.mark.skipif(
    not CASE_FILES,
    reason=f"shared cases not found at {_CASES_ROOT} (set SPEC_AUDITOR_SHARED_CASES to the shared/cases folder)",
)


def _normalize(case: dict):
    return normalize_response(
        case["api"],
        case.get("request"),
        response=case.get("response"),
        response_text=case.get("response_text"),
        stream=bool(case.get("stream")),
    )


@pytest.mark.parametrize("path", CASE_FILES, ids=[f"{p.parent.name}/{p.stem}" for p in CASE_FILES])
def test_normalizer_case(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    exp = case["expect"]
    out = _normalize(case)

    if "n_tokens" in exp:
        assert out.n_tokens == exp["n_tokens"]
    if "text" in exp:
        assert out.text == exp["text"]
    if "token_bytes" in exp:
        want = [None if b is None else bytes(b) for b in exp["token_bytes"]]
        assert out.token_bytes == want
    if "logprobs" in exp:
        got = out.logprobs
        assert len(got) == len(exp["logprobs"])
        for g, w in zip(got, exp["logprobs"], strict=True):
            if w is None:
                assert g is None
            else:
                assert g is not None and math.isclose(g, w, rel_tol=0, abs_tol=1e-12)
    found = set(out.anomalies)
    for kind in exp.get("anomalies_include", []):
        assert kind in found, f"missing anomaly {kind}; got {sorted(found)}"
    for kind in exp.get("anomalies_exclude", []):
        assert kind not in found, f"unexpected anomaly {kind}; got {sorted(found)}"
    if "anomalies_exact" in exp:
        assert found == set(exp["anomalies_exact"]), out.anomaly_details
    # invariants: known vocabulary, JSON-safe finite numbers, logprobs never positive
    assert found <= set(ANOMALY_KINDS)
    for t in out.tokens:
        assert t.logprob is None or (math.isfinite(t.logprob) and t.logprob <= 1e-6)
        for _, _, v in t.top_logprobs:
            assert v is None or (math.isfinite(v) and v > -9999)
    json.loads(out.model_dump_json())
    # reasoning responses: every token is labelled, reasoning tokens are kept as evidence
    if path.parent.name == "reasoning" and "reasoning_logprobs_inconsistent" not in found:
        assert all(t.span in ("reasoning", "answer") for t in out.tokens)
        assert "bytes_text_mismatch" not in found


@pytest.mark.skipif(not (_CASES_ROOT / "reasoning").is_dir(), reason="shared reasoning cases absent")
def test_reasoning_folder_is_loaded() -> None:
    """The reasoning folder's cases are part of the parametrized set (not silently dropped)."""
    assert any(p.parent.name == "reasoning" for p in CASE_FILES)
