"""Backoff scheduling (rewrites/schedule.py Backoff, rewrites/backoff.py): a family rule over
its match limit sits out a few iterations, comes back with a larger limit, and its ban
is reported; a phase is called saturated only when no rule is banned."""

from __future__ import annotations

import egglog.bindings as eb

from benchmarks.synthetic import split_cat_chain
from optimus_eqsat import rewrites
from optimus_eqsat.rewrites.backoff import BackoffScheduler, split_family
from optimus_eqsat.rewrites.schedule import Backoff, compose
from optimus_eqsat.rulesets import select_rulesets
from optimus_eqsat.saturate import EGraphSession, Limits, StopReason
from optimus_eqsat.translate import translate

SMALL = Backoff(matches_per_fx_node=0, min_match_limit=10, ban_length=2, growth=2)


def test_rule_over_its_limit_is_banned_then_returns_with_a_larger_limit():
    scheduler = BackoffScheduler(SMALL, fx_nodes=100)
    assert scheduler.record(1, {"a": 10, "b": 3}) == []  # at the limit: no ban
    (ban,) = scheduler.record(2, {"a": 11, "b": 3})
    assert (ban.rule, ban.iteration, ban.matches, ban.limit, ban.until) == ("a", 2, 11, 10, 5)
    assert scheduler.banned(3) == scheduler.banned(4) == {"a"}
    assert scheduler.banned(5) == set()  # back after ban_length iterations
    assert scheduler.record(5, {"a": 20}) == []  # the limit doubled
    (again,) = scheduler.record(6, {"a": 21})
    assert (again.limit, again.until) == (20, 6 + 1 + 4)  # and so did the ban
    assert scheduler.times_banned == {"a": 2}


def test_bring_forward_ends_the_earliest_ban_when_nothing_changed():
    scheduler = BackoffScheduler(SMALL, fx_nodes=0)
    scheduler.record(1, {"a": 100})  # banned for 2, 3
    scheduler.record(2, {"b": 100})  # banned for 3, 4
    assert scheduler.bring_forward(2)  # iteration 2 changed nothing: a's ban ends, b's moves as much
    assert scheduler.banned(3) == {"b"} and scheduler.banned(4) == set()
    assert scheduler.bring_forward(3)  # b was banned in 3: not saturated yet
    assert scheduler.banned(4) == set()
    assert not scheduler.bring_forward(4)  # nothing banned: saturated


def test_match_limit_scales_with_the_graph():
    backoff = Backoff()
    assert backoff.match_limit(10) == backoff.min_match_limit
    assert backoff.match_limit(100_000) == 1_000_000
    assert backoff.match_limit(100_000, bans=2) == 4_000_000
    assert backoff.ban_iterations(1) == 2 * backoff.ban_length


def test_family_split_runs_like_one_ruleset_and_leaves_banned_rules_out():
    program = """
    (datatype E (N i64) (Add E E))
    (ruleset fam)
    (rule ((= t (Add a b))) ((union t (Add b a))) :ruleset fam :name "comm")
    (rewrite (Add a (N 0)) a :ruleset fam)
    (birewrite (Add a (N 1)) (Add (N 1) a) :ruleset fam :name "one")
    (Add (N 1) (N 2))
    (Add (N 3) (N 0))
    """
    egraph = eb.EGraph()
    text, split = split_family(program, "fam")
    egraph.run_program(*egraph.parse_program(text))
    assert list(split.rulesets) == ["comm", "fam#1", "one"]
    declared = []

    def declare(name, rulesets):
        declared.append((name, rulesets))
        egraph.run_program(*egraph.parse_program(f"(unstable-combined-ruleset {name} {' '.join(rulesets)})"))

    assert split.without([], declare) == "fam" and split.without(["comm", "fam#1", "one"], declare) is None
    without_comm = split.without(["comm"], declare)
    assert declared == [(without_comm, ["fam@1", "fam@2"])]
    (out,) = egraph.run_program(*egraph.parse_program(f"(run-schedule (run {without_comm}))"))
    assert split.matches(out.report.num_matches_per_rule) == {"fam#1": 1, "one": 1}
    (out,) = egraph.run_program(*egraph.parse_program("(run-schedule (run fam))"))
    assert split.matches(out.report.num_matches_per_rule)["comm"] > 0


def test_compose_leaves_out_a_family_whose_rules_are_all_banned():
    rulesets = select_rulesets(("splitcat", "algebraic"), ())
    step = compose(rulesets, {"splitcat": "splitcat__without1", "algebraic": None}).step
    assert "(run splitcat__without1)" in step and "(run algebraic)" not in step


def test_saturation_reports_bans_and_saturates_only_without_them():
    gm, _ = split_cat_chain(100)
    translation = translate(gm, None)
    session = EGraphSession(select_rulesets(("splitcat", "algebraic"), ()))
    session.load(translation.facts, fx_nodes=len(translation.nodes))
    sat = session.saturate(Limits(max_iterations=60, backoff=SMALL))
    assert sat.backoff_bans, "some splitcat rule matches more than 10 times an iteration here"
    for ban in sat.backoff_bans:
        # left out of the next iteration, and back (matching again) later
        assert ban.rule in sat.history[ban.iteration]["backoff_banned"]
        later = sat.history[ban.iteration + 1 :]
        assert any(ban.rule not in h["backoff_banned"] for h in later)
    assert sat.times_banned == {rule: sum(b.rule == rule for b in sat.backoff_bans) for rule in sat.times_banned}
    assert sat.stop_reason is StopReason.SATURATED
    assert sat.history[-1]["backoff_banned"] == []  # the last step ran every rule
    # the same e-graph as without backoff: bans delay rules, they do not drop them
    plain = EGraphSession(select_rulesets(("splitcat", "algebraic"), ()))
    plain.load(translation.facts, fx_nodes=len(translation.nodes))
    unbanned = plain.saturate(Limits(max_iterations=60))
    assert unbanned.stop_reason is StopReason.SATURATED and not unbanned.backoff_bans
    assert sat.enodes == unbanned.enodes


def _family_rules(egraph: eb.EGraph, text: str, ruleset: str) -> list[str]:
    """Names of the rules egglog's parser puts in ``ruleset``."""
    names = []
    for c in egraph.parse_program(text):
        if isinstance(c, eb.RuleCommand) and c.rule.ruleset == ruleset:
            names.append(c.rule.name)
        elif isinstance(c, (eb.RewriteCommand, eb.BiRewriteCommand)) and c.name == ruleset:
            names.append(c.rewrite.name)
    return names


def test_split_moves_every_rule_of_the_shipped_families():
    egraph = eb.EGraph()
    for family in rewrites.builtin_rulesets().values():
        text, split = split_family(family.program, family.name)
        assert sorted(split.rulesets) == sorted(_family_rules(egraph, family.program, family.name))
        assert _family_rules(egraph, text, family.name) == []  # none left in the family itself
        for rule, ruleset in split.rulesets.items():
            assert _family_rules(egraph, text, ruleset) == [rule]


def test_split_reads_conditions_strings_and_comments():
    program = """
    ; (rule ((= t (N 0))) ((N 1)) :ruleset fam :name "commented out")
    (datatype E (N i64) (S String E))
    (ruleset fam)
    (ruleset other)
    (rewrite (S "a)(;" x) x :when ((= x (N 1))) :ruleset fam :name "odd \\"name\\" (;")
    (rule ((= t (S "q" x))) ((union t x)) :ruleset other)
    (rule ((= t (S "r" x))) ((union t x)) :ruleset fam)
    """
    text, split = split_family(program, "fam")
    assert list(split.rulesets) == ['odd "name" (;', "fam#1"]
    egraph = eb.EGraph()
    assert _family_rules(egraph, text, "fam@0") == ['odd "name" (;']
    assert _family_rules(egraph, text, "fam@1") == ["fam#1"]
    assert len(_family_rules(egraph, text, "other")) == 1
