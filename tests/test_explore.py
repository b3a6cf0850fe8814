"""The notebook explorer on a tiny split/cat model: tables, steering, export, pictures."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.nn as nn

from optimus_eqsat.explore import Explorer, ExportMismatch, Picture, SteeringError, display
from optimus_eqsat.explore.rules import rules_of, without_rules
from optimus_eqsat.rewrites import RuleSet
from optimus_eqsat.sexpr import read_forms


class SplitCat(nn.Module):
    """split -> cat round trip, relu, then a shuffled split -> cat."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = torch.split(x, 4, dim=1)
        y = torch.relu(torch.cat([a, b, c], dim=1))
        p, q = torch.split(y, 6, dim=1)
        return torch.sigmoid(torch.cat([q, p], dim=1))


@pytest.fixture(scope="module")
def ex() -> Explorer:
    return Explorer(SplitCat(), (torch.randn(3, 12),), extractor="greedy")


def test_history_and_rules(ex: Explorer) -> None:
    h = ex.history()
    assert len(h) >= 1 and (h["enodes"] > 0).all()
    assert h["eclasses"].iloc[-1] == len(ex.egraph.classes)
    rules = ex.rules()
    assert rules.loc[rules["fired"]].index.isin(list(ex.rules_fired())).all()
    assert ex.rules_fired() and all(v > 0 for v in ex.rules_fired().values())
    assert not ex.matches().empty
    assert ex.plot_history() is not None and ex.plot_rules() is not None


def test_alternatives_mark_the_chosen_node(ex: Explorer) -> None:
    table = ex.alternatives("cat_1")
    assert isinstance(table, pd.DataFrame)
    assert table["chosen_now"].sum() == 1
    chosen = table.index[table["chosen_now"]][0]
    assert chosen == ex.choice[ex.eclass("cat_1")]
    assert math.isfinite(table.loc[chosen, "cost_us"])
    assert "cat_1" in set(table["original_of"])  # the loaded term is in its class


def test_replaced_and_rewritten(ex: Explorer) -> None:
    r = ex.replaced("cat")  # split -> cat round trip: the cat is the input itself
    assert r.changed and r.chosen == "x"
    assert r.candidate_rules
    assert "cat" in ex.rewritten().index
    with pytest.raises(KeyError, match="split"):
        ex.eclass("split")


def test_forbid_and_pin_change_the_extraction(ex: Explorer) -> None:
    c = ex.eclass("cat_1")
    default = ex.default.choice[c]
    ex.forbid("cat_1", default)
    assert ex.choice[c] != default
    assert ex.alternatives("cat_1").loc[default, "steering"] == "forbidden"
    assert list(ex.compare().index) == ["original", "default", "steered"]
    ex.export()  # verified against the original
    ex.clear_steering()
    assert ex.choice[c] == default
    other = next(k for k, n in enumerate(ex.egraph.classes[c]) if k != default and n.ctor != "Id")
    ex.pin("cat_1", other)
    assert ex.choice[c] == other
    ex.export()
    ex.clear_steering()


def test_impossible_pin_is_undone(ex: Explorer) -> None:
    # the cat of x's own pieces, pinned in x's class, would read itself
    with pytest.raises(SteeringError):
        ex.pin("cat", "original")
    assert not ex.steering


def test_export_raises_on_wrong_numerics(ex: Explorer, monkeypatch: pytest.MonkeyPatch) -> None:
    import optimus_eqsat.explore.explorer as module

    real = module.rebuild

    def broken(*args, **kwargs):
        gm = real(*args, **kwargs)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(out):
            neg = gm.graph.call_function(torch.neg, (out.args[0],))
        out.args = (neg,)
        gm.recompile()
        return gm

    monkeypatch.setattr(module, "rebuild", broken)
    with pytest.raises(ExportMismatch):
        ex.export()


def test_ban_rule_resaturates_without_it() -> None:
    ex = Explorer(SplitCat(), (torch.randn(3, 12),), extractor="greedy")
    fired = ex.rules_fired()
    rule = next(r for r in fired if ex.catalogue[r].family != "shapes")
    ex.ban_rule(rule)
    assert rule not in ex.rules_fired()
    assert ex.rules().loc[rule, "banned"]
    ex.export()


def test_neighbourhood_is_bounded(ex: Explorer) -> None:
    pic = ex.neighbourhood("cat_1", depth=10, up=2, max_classes=4, max_nodes_per_class=2)
    assert isinstance(pic, Picture)
    assert pic.dot.count("subgraph cluster_") <= 4
    assert "<table>" in pic.fallback_html
    assert pic._repr_html_()


def test_pictures_and_code(ex: Explorer, monkeypatch: pytest.MonkeyPatch) -> None:
    pic = ex.picture("original")
    assert "cluster_k" in pic.dot  # nodes grouped into predicted kernels
    assert "def forward" in str(ex.code("default"))
    assert "<div" in ex.side_by_side()._repr_html_()
    monkeypatch.setattr(display, "dot_binary", lambda: None)  # no Graphviz: HTML fallback
    fallback = ex.picture("default")
    assert fallback.svg is None and "<table>" in fallback._repr_html_()


@pytest.mark.skipif(display.dot_binary() is None, reason="Graphviz dot not installed")
def test_svg_rendering(ex: Explorer) -> None:
    svg = ex.picture("default").svg
    assert svg is not None and svg.startswith("<svg")


def test_rule_programs_are_read_and_cut() -> None:
    program = """(ruleset r) ; comment (with parens
(rewrite (A x) (B x) :ruleset r :name "a-b")
(rule ((= t (A x)))
      ((union t (C x))) :ruleset r :name "a-c")"""
    rs = RuleSet("r", program)
    assert len(read_forms(program)) == 3
    infos = {r.name: r for r in rules_of(rs)}
    assert infos["a-b"].builds == {"B"} and not infos["a-b"].merges
    assert infos["a-c"].builds == {"C"} and infos["a-c"].merges
    cut = without_rules(rs, {"a-c"})
    assert [r.name for r in rules_of(cut)] == ["a-b"]


def test_history_counts_eclasses_per_iteration():
    from optimus_eqsat.explore import Explorer

    def f(x):
        s = torch.split(x, 2, dim=1)
        return torch.cat([s[1], s[0], s[2]], dim=1).relu()

    explorer = Explorer(torch.fx.symbolic_trace(f), (torch.randn(3, 6),))
    history = explorer.history()
    assert history["eclasses"].notna().all() and (history["eclasses"] > 0).all()
