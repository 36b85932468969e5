"""Tests of tinyformer.claims: conclusions asserted with a margin, and their record."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tinyformer.claims import claim


def test_a_claim_that_holds_returns_nothing_and_records_its_room(tmp_path, monkeypatch):
    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv("TINYFORMER_CLAIMS_LOG", str(log))
    assert claim("the loss fell below the baseline", 1.0, "<", 1.5, margin=0.2) is None
    assert claim("accuracy is above chance", np.float32(0.75), ">", 0.5, margin=0.1) is None
    rooms = [json.loads(line)["room"] for line in log.read_text().splitlines()]
    assert rooms == [0.5, 0.25]


@pytest.mark.parametrize(
    ("value", "relation", "bound", "margin"),
    [(1.45, "<", 1.5, 0.1), (1.6, "<", 1.5, 0.0), (0.55, ">", 0.5, 0.1), (0.5, ">", 0.5, 0.0)],
)
def test_a_claim_inside_its_margin_fails_and_says_why(value, relation, bound, margin):
    with pytest.raises(AssertionError, match=r"does not hold: it needs .* the room is"):
        claim("the conclusion", value, relation, bound, margin=margin)


def test_claims_are_recorded_when_asked(tmp_path, monkeypatch):
    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv("TINYFORMER_CLAIMS_LOG", str(log))
    claim("first", 3.0, ">", 1.0, margin=0.5)
    claim("second", -2.0, "<", 0.0, margin=1.0)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["statement"] for r in rows] == ["first", "second"]
    assert rows[0] == {
        "statement": "first", "value": 3.0, "relation": ">", "bound": 1.0, "margin": 0.5,
        "room": 2.0,
    }  # fmt: skip
    with pytest.raises(AssertionError):
        claim("third", 0.0, ">", 1.0, margin=0.0)
    assert len(log.read_text().splitlines()) == 2  # a failed claim is not recorded


def test_nothing_is_recorded_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("TINYFORMER_CLAIMS_LOG", raising=False)
    monkeypatch.chdir(tmp_path)
    claim("quiet", 1.0, ">", 0.0, margin=0.0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"statement": ""}, TypeError, "statement must be a non-empty string"),
        ({"relation": ">="}, ValueError, "relation"),
        ({"value": float("nan")}, ValueError, "value must be finite"),
        ({"bound": "1"}, TypeError, "bound must be a real number"),
        ({"value": True}, TypeError, "value must be a real number"),
        ({"margin": -0.1}, ValueError, "margin must be at least 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, match):
    arguments = {"statement": "s", "value": 1.0, "relation": ">", "bound": 0.0, "margin": 0.1}
    arguments.update(kwargs)
    margin = arguments.pop("margin")
    with pytest.raises(error, match=match):
        claim(*arguments.values(), margin=margin)
