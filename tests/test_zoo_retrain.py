"""`crs zoo --retrain`: one model trained anew and set beside its shipped copy (the training tier)."""

from __future__ import annotations

import pytest

import crslib  # noqa: F401
from crslib.cli import main
from crslib.models.zoo_shipped import shipped_card
from crslib.zoo_retrain import RETRAIN_COLUMNS, retrain_zoo

NAME = "supervised_multilabel-cnn_small-seed0"


@pytest.mark.training
def test_retraining_one_model_prints_its_comparison_with_the_shipped_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CRS_CACHE_DIR", str(tmp_path))
    code = main(["zoo", "--retrain", "--models", NAME])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.strip().startswith(NAME)]
    assert len(lines) == 1 and "[" in lines[0]  # the shipped and the retrained margins with their intervals
    shipped = shipped_card(NAME)["probe"]
    assert f"{shipped['difference']:+.3f} [{shipped['low']:+.3f}, {shipped['high']:+.3f}]" in lines[0]
    table = retrain_zoo("default", models=[NAME])  # reused from the cache the command filled
    assert table.columns.tolist() == RETRAIN_COLUMNS and table["name"].tolist() == [NAME]
    row = table.iloc[0]
    assert bool(row["retrained_learned"]) and row["retrained_low"] > 0
    assert 0.0 <= row["overlap_with_shipped"] <= 1.0
    if row["same_weights"]:  # the machine that trained the shipped zoo: bit-for-bit the same model
        assert row["overlap_with_shipped"] == 1.0


def test_a_pattern_that_matches_no_model_is_one_line(capsys):
    assert main(["zoo", "--retrain", "--models", "no-such-model-*"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no zoo model matches" in err[0]
