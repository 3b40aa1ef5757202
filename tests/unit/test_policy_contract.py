"""The policy and the blocker table are contracts: every bound, default, `frozen` and `extra=forbid`
is pinned here, so deleting one fails a test (mutation testing showed 18% of their mutants killed)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from pydantic import ValidationError

from engine.blockers import BLOCKER_CODES, Blocker, safe_text
from engine.errors import UsageError
from engine.policy import Policy, load_policy
from engine.quality_budgets import DEFAULT_QUALITY_BUDGETS, QualityBudget
from engine.quant.compute import COMPUTE_CLASSES
from engine.quant.precision import PRECISION_CLASSES
from engine.thresholds import DEFAULT_RUNTIME_THRESHOLDS

# field: (lowest accepted, highest accepted or None when unbounded)
BOUNDS = {"tie_ulps": (0, 16), "reader_crosscheck_rows": (2, 64), "max_context_tokens": (16, None),
          "max_logit_positions": (1, None), "systematic_fraction": (0.5, 1.0)}
DEFAULTS = {"version": "2026.12-1", "reproduce_quantized": True, "reproduce_sample": 1.0, "tie_ulps": 4,
            "reader_crosscheck_rows": 4,
            "token_ids_exact": True, "require_top1_equal": True, "contradiction_high_cosine": 0.999,
            "contradiction_low_cosine": 0.9, "max_context_tokens": 2048, "max_logit_positions": 256,
            "without_imatrix": "no-go", "other_quantizer": "no-go", "systematic_fraction": 0.5}


@pytest.mark.parametrize("field", sorted(BOUNDS))
def test_each_bound_accepts_its_edge_and_refuses_one_past_it(field):
    low, high = BOUNDS[field]
    assert getattr(Policy(**{field: low}), field) == low
    with pytest.raises(ValidationError, match=field):
        Policy(**{field: low - 1})
    if high is not None:
        assert getattr(Policy(**{field: high}), field) == high
        with pytest.raises(ValidationError, match=field):
            Policy(**{field: high + 1})
    else:
        assert getattr(Policy(**{field: 10**6}), field) == 10**6


def test_defaults_are_the_documented_ones():
    policy = Policy()
    assert {name: getattr(policy, name) for name in DEFAULTS} == DEFAULTS
    assert policy.runtime == dict(DEFAULT_RUNTIME_THRESHOLDS)
    assert policy.quality == dict(DEFAULT_QUALITY_BUDGETS) and policy.quality_slices == {}


def test_a_policy_is_frozen():
    policy = Policy()
    with pytest.raises(ValidationError, match="frozen"):
        policy.tie_ulps = 5  # type: ignore[misc]
    assert policy.tie_ulps == 4


def test_unknown_keys_are_refused():
    with pytest.raises(ValidationError, match="min_cosine"):
        Policy(min_cosine=-1)  # type: ignore[call-arg]


def test_every_compute_class_needs_thresholds_and_they_keep_the_class_order():
    partial = {name: DEFAULT_RUNTIME_THRESHOLDS[name] for name in COMPUTE_CLASSES[1:]}
    with pytest.raises(ValidationError, match=r"thresholds missing for compute classes \['f32'\]"):
        Policy(runtime=partial)
    shuffled = dict(reversed(list(DEFAULT_RUNTIME_THRESHOLDS.items())))
    policy = Policy(runtime=shuffled)
    assert tuple(policy.runtime) == COMPUTE_CLASSES
    for name in COMPUTE_CLASSES:
        assert policy.thresholds([name]) == DEFAULT_RUNTIME_THRESHOLDS[name]
    loose = policy.thresholds(["f16", "q8_k"])  # a mixed file is held to the loosest of its classes
    assert loose.max_kl_mean == max(policy.runtime["f16"].max_kl_mean, policy.runtime["q8_k"].max_kl_mean)
    assert loose.min_cosine == min(policy.runtime["f16"].min_cosine, policy.runtime["q8_k"].min_cosine)


def test_every_precision_class_needs_a_quality_budget_and_slices_are_free():
    partial = {name: DEFAULT_QUALITY_BUDGETS[name] for name in PRECISION_CLASSES[1:]}
    with pytest.raises(ValidationError, match=r"quality budgets missing for precision classes \['float'\]"):
        Policy(quality=partial)
    named = Policy(quality_slices={"korean": QualityBudget(max_kl_mean=0.5)})
    assert named.quality_slices["korean"].max_kl_mean == 0.5 and named.sha256() != Policy().sha256()
    with pytest.raises(ValidationError, match="max_kl_mean"):
        QualityBudget(max_kl_mean=-1)
    with pytest.raises(ValidationError, match="extra"):
        QualityBudget(kl=1)  # type: ignore[call-arg]


def test_the_digest_is_of_the_canonical_json_and_changes_with_any_value():
    policy = Policy()
    canonical = json.dumps(policy.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert canonical.startswith('{"contradiction_high_cosine":0.999,')
    assert policy.sha256() == hashlib.sha256(canonical.encode()).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", policy.sha256())
    assert Policy(tie_ulps=5).sha256() != policy.sha256()
    assert Policy().sha256() == policy.sha256()


def test_load_policy(tmp_path):
    assert load_policy(None) == Policy()
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"tie_ulps": 2, "token_ids_exact": False}), encoding="utf-8")
    assert load_policy(good) == Policy(tie_ulps=2, token_ids_exact=False)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tie_ulps": 99}))
    with pytest.raises(UsageError, match=r"(?s)^invalid policy .*bad\.json: .*tie_ulps"):
        load_policy(bad)
    with pytest.raises(UsageError, match=r"^cannot read policy .*missing\.json: No such file"):
        load_policy(tmp_path / "missing.json")
    not_utf8 = tmp_path / "latin1.json"
    not_utf8.write_bytes('{"version": "caf\u00e9"}'.encode("latin-1"))
    with pytest.raises(UsageError, match=r"(?s)^invalid policy .*latin1\.json: .*invalid unicode"):
        load_policy(not_utf8)


# --- the blocker table ----------------------------------------------------------------------------------

def test_blocker_table_invariants():
    assert len(BLOCKER_CODES) == len(set(BLOCKER_CODES))
    families = {code.split(".")[0] for code in BLOCKER_CODES}
    assert families == {"gguf", "source", "tensor", "metadata", "tokenizer", "embedding", "logits", "runtime",
                        "release", "verifier", "measurement", "gate", "artifact", "rerank", "imatrix", "chat",
                        "quality"}
    for code, meaning in BLOCKER_CODES.items():
        assert re.fullmatch(r"[a-z0-9]+\.[a-z0-9_]+", code), code
        assert meaning == meaning.strip() and "\n" not in meaning and not meaning.endswith("."), code
    assert "gate.not_run" in BLOCKER_CODES and "metadata.wrong_type" in BLOCKER_CODES


def test_a_blocker_is_frozen_refuses_extra_fields_and_unknown_gates():
    blocker = Blocker(code="gate.not_run", gate="runtime", why="nothing measured")
    assert (blocker.tensor, blocker.text, blocker.key) == (None, None, None)
    with pytest.raises(ValidationError, match="frozen"):
        blocker.why = "changed"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        Blocker(code="gate.not_run", gate="runtime", why="x", severity="low")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="gate"):
        Blocker(code="gate.not_run", gate="network", why="x")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"unknown blocker code 'gate\.maybe': add it to BLOCKER_CODES"):
        Blocker(code="gate.maybe", gate="runtime", why="x")


def test_blocker_text_fields_are_always_encodable():
    blocker = Blocker(code="gguf.bad_key", gate="storage", why="a\udcffb", tensor="t\ud800", text="x\udc80", key="k")
    assert (blocker.why, blocker.tensor, blocker.text, blocker.key) == ("a\\udcffb", "t\\ud800", "x\\udc80", "k")
    assert safe_text("plain é") == "plain é"
    blocker.model_dump_json().encode("utf-8")
