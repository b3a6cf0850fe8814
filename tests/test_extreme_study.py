"""The extreme study's generators, its floor programs and its row function (fast: a few
features, no Inductor compile)."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.extreme_floor import FAMILIES, RaggedFloor, check
from benchmarks.extreme_report import targets, write_study
from benchmarks.extreme_study import StudyOptions, study_row
from benchmarks.zoo.generators import GENERATORS
from benchmarks.zoo.uniform_towers import OUT, WIDTH, UniformTowers


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generators_are_deterministic_and_leave_the_rng_alone(name):
    spec = GENERATORS[name]
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b = spec.build(7, seed=0), spec.build(7, seed=0)
    inputs = spec.inputs(4, 0, 7)
    assert torch.equal(torch.rand(3), expected)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), spec.build(7, seed=1).parameters()))
    assert all(torch.equal(x, y) for x, y in zip(inputs, spec.inputs(4, 0, 7), strict=True))
    out = a(*inputs)
    assert out.shape[0] == 4 and torch.isfinite(out).all()


def test_uniform_towers_shapes_and_parameters():
    spec = GENERATORS["uniform"]
    model = spec.build(5)
    (dense,) = spec.inputs(4, 0, 5)
    assert isinstance(model, UniformTowers) and len(model.towers) == 5
    assert dense.shape == (4, 5 * WIDTH)
    assert model(dense).shape == (4, 5 * OUT)
    # parameters per tower: layer norm weight and bias, linear weight and bias
    assert sum(1 for _ in model.parameters()) == 5 * 4
    with pytest.raises(ValueError):
        UniformTowers(0)


def test_uniform_towers_forward_matches_a_per_tower_reference():
    spec = GENERATORS["uniform"]
    model = spec.build(3, seed=2)
    (dense,) = spec.inputs(6, 1, 3)
    expected = []
    for i, tower in enumerate(model.towers):
        x = dense[:, i * WIDTH : (i + 1) * WIDTH]
        mean = x.mean(dim=1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=1, keepdim=True)
        normed = (x - mean) / torch.sqrt(var + tower.norm.eps) * tower.norm.weight + tower.norm.bias
        expected.append(torch.clamp(normed @ tower.proj.weight.T + tower.proj.bias, min=0))
    with torch.no_grad():
        torch.testing.assert_close(model(dense), torch.cat(expected, dim=1))


@pytest.mark.parametrize("features", [3, 4, 5, 25, 49])  # tails of 0, 1, 2 features; partial passthrough blocks
@pytest.mark.parametrize("family", FAMILIES)
def test_floor_programs_compute_the_ragged_function(family, features):
    spec = GENERATORS["ragged"]
    model = spec.build(features).eval()
    assert check(model, RaggedFloor(model, family), spec.inputs(4, 0, features)) < 1e-5


def test_floor_needs_the_width_cycle():
    with pytest.raises(ValueError):
        RaggedFloor(GENERATORS["ragged"].build(2), "padded")
    with pytest.raises(ValueError):
        RaggedFloor(GENERATORS["ragged"].build(3), "nope")


def test_study_row_at_a_few_features(tmp_path):
    """The row function end to end without Inductor's compile: predictions, the optimizer
    per profile and mode, training graphs, the ragged floor; then the tables."""
    rows = [
        study_row("uniform", 3, StudyOptions(inductor_optimus=False, profiles=("h200",))),
        study_row("ragged", 3, StudyOptions(training=False, profiles=("h200",))),
    ]
    uniform, ragged = rows
    for row in rows:
        for variant in ("inf", "frozen"):
            assert row[f"h200_{variant}_ours"] <= row[f"h200_{variant}_default"]
        assert row["opt_s_h200_inf"] > 0 and row["pred_h200_frozen_ours_us"] > 0
        assert "cpu_inf_default" not in row and "opt_s_cpu_inf" not in row  # no Inductor, no cpu profile
    assert uniform["h200_frozen_ours"] < uniform["h200_frozen_default"]  # three towers already batch
    assert uniform["h200_train_ours"] <= uniform["h200_train_default"] and uniform["opt_cpu_s_h200_train"] > 0
    assert "h200_train_ours" not in ragged and "inductor_passes_s" in ragged
    assert ragged["floor_frozen"] <= ragged["h200_frozen_default"] and ragged["floor_any_frozen"] <= 10
    args = argparse.Namespace(
        generator="both", features="3", training="3", inductor="", batch=8, no_inductor_optimus=True, out=str(tmp_path)
    )
    write_study(rows, args, tmp_path)
    text = (tmp_path / "extreme_study.md").read_text()
    assert "Predicted H200 launches" in text and "--generator both" in text
    assert "ragged 3: frozen launches" in text and "ragged 3: train" not in text
    assert (tmp_path / "extreme_study.csv").read_text().startswith("generator,features")


def test_ragged_programs_are_within_the_target_of_their_floor():
    """35 features: whole triples and a tail of two, two whole passthrough blocks (a cyclic
    run the head's cat reads as one view) and a partial third. Inference and frozen
    inference within 1.2x of the padded floor's predicted launches (the study's target)."""
    row = study_row("ragged", 35, StudyOptions(training=False, inductor_optimus=False, profiles=("h200",)))
    for variant in ("inf", "frozen"):
        assert row[f"h200_{variant}_ours"] <= 1.2 * row[f"floor_{variant}"], row


def test_targets_judge_the_uniform_reductions():
    row = {
        "generator": "uniform",
        "features": 2000,
        "h200_inf_default": 6000,
        "h200_inf_ours": 5,
        "h200_inf_x": 1200.0,
        "h200_train_default": 16000,
        "h200_train_ours": 40,
        "h200_train_x": 400.0,
        "opt_s_h200_inf": 12.0,
        "opt_cpu_s_h200_inf": 10.0,
    }
    table = targets([row]).set_index("target")["met"]
    assert table["uniform 2000: inf launches reduction >= 1000x"]
    assert not table["uniform 2000: train launches reduction >= 500x"]
    assert table["uniform 2000: optimizer (h200_inf) < 30 s"] == "wall True, CPU True"
