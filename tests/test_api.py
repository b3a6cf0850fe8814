"""optimize_graph on the graphs users have, and its behaviour on bad input."""

from __future__ import annotations

import gc
import logging

import pytest
import torch
import torch.nn as nn

from benchmarks.synthetic import split_cat_chain
from optimus_eqsat import OptimizationError, optimize_graph
from optimus_eqsat.rewrites import RuleFileError
from tests.helpers import assert_same_numerics, op_counts


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 6)
        self.register_buffer("scale", torch.full((6,), 0.5))

    def forward(self, x):
        a, b, c = x.split(4, dim=-1)
        y = torch.cat([a, b, c], dim=-1)
        return self.proj(y) * self.scale, torch.stack([a, b], dim=0)


def test_symbolic_trace_graph_keeps_interface_and_params():
    model = Model()
    x = torch.randn(5, 12)
    gm = torch.fx.symbolic_trace(model)
    optimized = optimize_graph(gm, (x,), raise_on_error=True)
    assert [n.name for n in optimized.graph.nodes if n.op == "placeholder"] == ["x"]
    assert dict(optimized.named_parameters()).keys() == dict(gm.named_parameters()).keys()
    assert "split" not in op_counts(optimized)
    assert isinstance(optimized(x), tuple) and len(optimized(x)) == 2
    assert_same_numerics(model, optimized, (x,))


def _dynamo_graph(model, *inputs, dynamic=False):
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, example_inputs))
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=capture, dynamic=dynamic, fullgraph=True)(*inputs)
    return captured[0]


def test_dynamo_graph_uses_meta_shapes():
    model = Model()
    x = torch.randn(5, 12)
    gm, example_inputs = _dynamo_graph(model, x)
    optimized = optimize_graph(gm, raise_on_error=True)  # shapes from meta["example_value"]
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back and report.rules_fired
    torch.testing.assert_close(optimized(*example_inputs), gm(*example_inputs))


def test_dynamic_shapes_do_not_crash():
    model = Model()
    x = torch.randn(5, 12)
    gm, example_inputs = _dynamo_graph(model, x, dynamic=True)
    optimized = optimize_graph(gm)
    assert not optimized.meta["optimus_eqsat"].fell_back or optimized.meta["optimus_eqsat"].fallback_reason
    concrete = [a for a in example_inputs if isinstance(a, torch.Tensor)]
    ints = [a for a in example_inputs if not isinstance(a, torch.Tensor)]
    if not ints:
        torch.testing.assert_close(optimized(*concrete), gm(*concrete))


def test_export_graph():
    model = Model()
    x = torch.randn(5, 12)
    gm = torch.export.export(model, (x,)).module()
    optimized = optimize_graph(gm, raise_on_error=True)
    torch.testing.assert_close(optimized(x), model(x))
    assert optimized.meta["optimus_eqsat"].rules_fired


class DictTowers(nn.Module):
    """Towers over features passed as a dict, as rechub models take their inputs."""

    def __init__(self):
        super().__init__()
        self.towers = nn.ModuleDict({name: nn.Linear(4, 3) for name in ("user", "item", "context")})

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([torch.relu(self.towers[name](x)) for name, x in features.items()], 1)


def test_an_exported_module_takes_its_example_inputs_as_it_is_called():
    """``ExportedProgram.module()`` is called with the user's pytree (a dict of features) and
    flattens it into its placeholders; example inputs given that way are flattened the same way
    (by the program's input spec, so the dict's order does not matter)."""
    model = DictTowers()
    features = {name: torch.randn(6, 4) for name in ("user", "item", "context")}
    gm = torch.export.export(model, (features,)).module()
    reordered = dict(reversed(list(features.items())))
    optimized = optimize_graph(gm, (reordered,), raise_on_error=True)
    torch.testing.assert_close(optimized(features), model(features))
    assert optimized.meta["optimus_eqsat"].batched  # the towers batched: the inputs were read


def test_nothing_to_optimize_is_unchanged():
    def f(x, w):
        return torch.nn.functional.linear(x, w).cumsum(0)

    gm = torch.fx.symbolic_trace(f)
    optimized = optimize_graph(gm, (torch.randn(3, 4), torch.randn(5, 4)), raise_on_error=True)
    assert op_counts(optimized) == op_counts(gm)


@pytest.mark.parametrize("returns", [lambda x: None, lambda x: (1, 2)], ids=["none", "constants"])
def test_a_graph_returning_no_computed_tensor_is_declined_quietly(returns, caplog):
    """A graph returning only None or constants (Dynamo hands such pieces over): nothing to extract is a decline
    (the graph as it is, the reason in the report), not a failure with a warning."""
    gm = torch.fx.symbolic_trace(returns)
    with caplog.at_level(logging.WARNING, logger="optimus_eqsat"):
        result = optimize_graph(gm, (torch.randn(3, 2),), raise_on_error=True)
    assert "nothing to optimize" in result.meta["optimus_eqsat"].fallback_reason
    assert not caplog.records
    assert result(torch.randn(5, 2)) == returns(torch.randn(5, 2))


def test_a_predicted_gain_below_min_gain_keeps_the_original():
    gm = torch.fx.symbolic_trace(Model())
    x = torch.randn(5, 12)
    assert optimize_graph(gm, (x,), profile="cpu").meta["optimus_eqsat"].changed  # min_gain 0: any gain
    report = optimize_graph(gm, (x,), profile="cpu", min_gain=0.99).meta["optimus_eqsat"]
    assert report.fell_back and "below min_gain 99%" in report.fallback_reason and not report.changed
    with pytest.raises(ValueError, match="min_gain"):
        optimize_graph(gm, (x,), min_gain=1.5)


def test_min_gain_of_a_piece_of_a_step_counts_the_rest_of_the_step():
    """A backward graph's gain is weighed against the whole step (its forward's time too)."""
    gm = torch.fx.symbolic_trace(Model())
    x = torch.randn(5, 12)
    alone = optimize_graph(gm, (x,), profile="cpu").meta["optimus_eqsat"]
    gain = alone.cost_before - alone.cost_after
    assert gain > 0
    rest = 100 * alone.cost_before  # the gain is under 1% of such a step
    report = optimize_graph(gm, (x,), profile="cpu", min_gain=0.01, rest_of_step_s=rest).meta["optimus_eqsat"]
    assert (
        report.fell_back
        and not report.changed
        and f"of a {alone.cost_before + rest:.3e} s step" in report.fallback_reason
    )
    assert (
        optimize_graph(gm, (x,), profile="cpu", min_gain=gain / (alone.cost_before + rest) / 2, rest_of_step_s=rest)
        .meta["optimus_eqsat"]
        .changed
    )
    with pytest.raises(ValueError, match="rest_of_step_s"):
        optimize_graph(gm, (x,), rest_of_step_s=-1.0)


def _raise_runtime_error(*args, **kwargs):
    raise RuntimeError("a failure inside the optimizer")


def test_garbage_collector_state_is_restored(monkeypatch):
    # optimize_graph pauses the cyclic collector while it runs (run_support.gc_paused)
    gm = torch.fx.symbolic_trace(Model())
    x = (torch.randn(5, 12),)
    assert gc.isenabled()
    optimize_graph(gm, x)
    assert gc.isenabled()
    monkeypatch.setattr("optimus_eqsat.api.translate", _raise_runtime_error)
    with pytest.raises(OptimizationError):  # fails inside the paused region
        optimize_graph(gm, x, raise_on_error=True)
    assert gc.isenabled()
    monkeypatch.undo()
    gc.disable()
    try:
        optimize_graph(gm, x)
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()


def test_input_is_not_mutated_and_result_is_new():
    gm = torch.fx.symbolic_trace(Model())
    code = gm.code
    optimized = optimize_graph(gm, (torch.randn(5, 12),))
    assert optimized is not gm and gm.code == code


def test_failure_inside_the_optimizer_falls_back_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr("optimus_eqsat.api.translate", _raise_runtime_error)
    gm = torch.fx.symbolic_trace(Model())
    with caplog.at_level(logging.WARNING, logger="optimus_eqsat"):
        optimized = optimize_graph(gm, (torch.randn(5, 12),))
    report = optimized.meta["optimus_eqsat"]
    assert report.fell_back and "a failure inside the optimizer" in report.fallback_reason
    assert "returning the original graph" in caplog.text
    assert op_counts(optimized) == op_counts(gm)
    with pytest.raises(OptimizationError):
        optimize_graph(gm, (torch.randn(5, 12),), raise_on_error=True)


@pytest.mark.parametrize("raise_on_error", [False, True])
def test_broken_rule_file_is_an_error_naming_the_file(tmp_path, raise_on_error):
    rules = tmp_path / "broken.egg"
    rules.write_text("(ruleset mine)\n(rewrite (Slice x) :ruleset mine)\n")
    gm = torch.fx.symbolic_trace(Model())
    with pytest.raises(RuleFileError, match=r"broken\.egg.*\n?.*option key must start"):
        optimize_graph(gm, (torch.randn(5, 12),), rule_files=[str(rules)], raise_on_error=raise_on_error)
    unknown = tmp_path / "unknown.egg"
    unknown.write_text('(ruleset mine)\n(rewrite (Unary "relu" x) (NoSuchOp x) :ruleset mine)\n')
    with pytest.raises(RuleFileError, match=r"unknown\.egg.*\n.*NoSuchOp"):
        optimize_graph(gm, (torch.randn(5, 12),), rule_files=[str(unknown)], raise_on_error=raise_on_error)


def test_missing_rule_file_is_an_error_naming_the_file(tmp_path):
    gm = torch.fx.symbolic_trace(Model())
    missing = tmp_path / "nowhere.egg"
    with pytest.raises(RuleFileError, match=r"nowhere\.egg: cannot read"):
        optimize_graph(gm, (torch.randn(5, 12),), rule_files=[str(missing)])
    from optimus_eqsat.backend import make_backend

    with pytest.raises(RuleFileError, match="nowhere"):  # when the backend is made, not inside a compile
        make_backend(rule_files=[str(missing)])


def test_example_inputs_that_do_not_fit_the_graph_are_named():
    gm = torch.export.export(nn.Linear(4, 3), (torch.randn(2, 4),)).module()
    with pytest.raises(OptimizationError, match=r"example input 0 .* \(2, 5\) .*expects \(2, 4\)"):
        optimize_graph(gm, (torch.randn(2, 5),), raise_on_error=True)
    with pytest.raises(OptimizationError, match="1 example inputs for 2 placeholders|2 example inputs for 1"):
        optimize_graph(gm, (torch.randn(2, 4), torch.randn(2, 4)), raise_on_error=True)
    fallback = optimize_graph(gm, (torch.randn(2, 5),))
    assert fallback.meta["optimus_eqsat"].fell_back
    traced = torch.fx.symbolic_trace(Model())  # no meta: the example run names where it failed
    with pytest.raises(OptimizationError, match=r"do not run through the graph: at 'proj'"):
        optimize_graph(traced, (torch.randn(5, 9),), raise_on_error=True)


def test_user_rule_file_is_used(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text(
        '(ruleset mine)\n(rewrite (Unary "tanh" (Unary "tanh" x)) (Unary "tanh" x) :ruleset mine :name "mine-wrong")\n'
    )
    gm = torch.fx.symbolic_trace(lambda x: x.relu())
    # tanh(tanh(x)) == tanh(x) is false: the rule checker would refuse the file
    optimized = optimize_graph(gm, (torch.randn(3),), rule_files=[str(rules)], raise_on_error=True, check_rules=False)
    assert "mine-wrong" not in optimized.meta["optimus_eqsat"].rules_fired  # loaded, never matched


def test_budget_exhausted_still_returns_a_correct_graph():
    model = Model()
    x = torch.randn(5, 12)
    gm = torch.fx.symbolic_trace(model)
    optimized = optimize_graph(gm, (x,), max_iterations=1, raise_on_error=True)
    assert optimized.meta["optimus_eqsat"].stop_reason in ("iteration_limit", "saturated")
    assert_same_numerics(model, optimized, (x,))


def test_unknown_option_and_bad_input_are_clear_errors():
    gm = torch.fx.symbolic_trace(Model())
    with pytest.raises(TypeError, match="unknown optimize_graph option"):
        optimize_graph(gm, no_such_option=1)
    with pytest.raises(TypeError, match="GraphModule"):
        optimize_graph(Model())
    with pytest.raises(ValueError, match="unknown ruleset"):
        optimize_graph(gm, rulesets=("nope",), raise_on_error=True)
    # values of the wrong kind: an error, not a fall-back from deep inside the run
    with pytest.raises(ValueError, match="time_limit_s must be a number"):
        optimize_graph(gm, time_limit_s="1")
    with pytest.raises(ValueError, match="never_worse must be True or False"):
        optimize_graph(gm, never_worse="yes")
    with pytest.raises(ValueError, match="profile must be"):
        optimize_graph(gm, profile=None)
    optimize_graph(gm, (torch.randn(5, 12),), max_enodes=None, time_limit_s=5, raise_on_error=True)  # ints are numbers


def test_rule_files_that_are_not_text_or_repeat_a_ruleset_are_errors(tmp_path):
    gm = torch.fx.symbolic_trace(Model())
    binary = tmp_path / "binary.egg"
    binary.write_bytes(b"\xff\xfe(ruleset \x80)")
    with pytest.raises(RuleFileError, match=r"binary\.egg: not a text"):
        optimize_graph(gm, rule_files=[str(binary)])
    rules = tmp_path / "mine.egg"
    rules.write_text('(ruleset mine)\n(rewrite (Scalar "mul" x 1.0) x :ruleset mine :name "mine-mul-one")\n')
    with pytest.raises(RuleFileError, match=r"same ruleset more than once: \['mine'\]"):
        optimize_graph(gm, rule_files=[str(rules), str(rules)])


def test_large_chain_round_trips():
    # 100,000 nodes: benchmarks/bench_pipeline.py; here a size that keeps the suite fast
    gm, (x,) = split_cat_chain(5_000, width=2, batch=1)
    optimized = optimize_graph(gm, raise_on_error=True, extractor="greedy")
    report = optimized.meta["optimus_eqsat"]
    assert not report.fell_back
    assert "cat" not in op_counts(optimized) and report.nodes_after < report.nodes_before / 2
    torch.testing.assert_close(optimized(x), gm(x))


def test_large_scalar_constants_round_trip():
    gm = torch.fx.symbolic_trace(lambda x: (x * 1e20 + 2.0) * 3)
    x = torch.randn(3)
    optimized = optimize_graph(gm, (x,), raise_on_error=True)
    torch.testing.assert_close(optimized(x), gm(x))


def test_constructors_of_a_user_rule_file_are_never_extracted(tmp_path):
    rules = tmp_path / "helper.egg"
    rules.write_text(
        "(ruleset mine)\n(constructor Mine (Tensor) Tensor)\n"
        '(rewrite (Unary op x) (Mine x) :ruleset mine :name "mine-helper")\n'
    )
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    x = torch.randn(4)
    optimized = optimize_graph(gm, (x,), rule_files=[str(rules)], raise_on_error=True)
    assert optimized.meta["optimus_eqsat"].rules_fired.get("mine-helper")
    torch.testing.assert_close(optimized(x), gm(x))


def test_run_loads_the_rulesets_it_is_given():
    # The explorer hands OptimizationRun edited rule programs; the run loads those, not the options'.
    from optimus_eqsat.api import OptimizationRun, OptimizeOptions

    gm, x = torch.fx.symbolic_trace(Model()), (torch.randn(5, 12),)
    options = OptimizeOptions(rulesets=("splitcat",))
    default = OptimizationRun(gm, x, options)
    default.saturate()
    splitcat_rules = set(options.egglog_rulesets()[0].rule_names)
    assert splitcat_rules & set(default.report.rules_fired)
    given = OptimizationRun(gm, x, options, rulesets=[])  # only the shape analysis is left
    given.saturate()
    assert not splitcat_rules & set(given.report.rules_fired)


def test_the_run_for_shapes_leaves_the_callers_buffers_alone():
    """Without shape meta the graph is run once on the example inputs: a batch norm in
    training then writes running statistics, which must stay the caller's own (seen:
    efficientnet_b0's Dynamo graph, five runs, num_batches_tracked 0 -> 5)."""
    import copy

    from optimus_eqsat.inductor_count import capture_dynamo_graph

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU()).train()
    reference = copy.deepcopy(model)
    x = torch.randn(16, 4)
    optimize_graph(torch.fx.symbolic_trace(model), (x,))  # the module's own buffers
    for a, b in zip(model.buffers(), reference.buffers()):
        assert torch.equal(a, b)
    gm, example = capture_dynamo_graph(model, (x,))  # buffers as inputs
    for node in gm.graph.nodes:
        node.meta.pop("example_value", None)
    before = [t.clone() for t in example]
    optimize_graph(gm, example)
    for a, b in zip(example, before):
        assert torch.equal(a, b)


def test_the_run_for_shapes_leaves_a_max_norm_table_alone():
    """An embedding with max_norm renormalizes the rows it looks up in place: the runs of
    the optimizer (shapes, prediction) put the table back, as a module and as a function."""
    import copy

    import torch.nn.functional as F

    from optimus_eqsat.fxvocab.mutation import written_attributes, written_inputs

    class Lookups(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Embedding(20, 8, max_norm=1.0)
            self.table = torch.nn.Parameter(torch.randn(20, 8) * 3)
            self.linears = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

        def forward(self, ids):
            a = self.module(ids)
            b = F.embedding(ids, self.table, max_norm=1.0)
            return torch.cat([self.linears[0](a), self.linears[1](b)], 1)

    torch.manual_seed(0)
    model = Lookups()
    gm = torch.fx.symbolic_trace(model)
    assert written_attributes(gm) == {"module.weight", "table"}
    (lookup,) = [n for n in gm.graph.nodes if n.target is F.embedding]
    assert [n.target for n in written_inputs(gm, lookup)] == ["table"]
    before = copy.deepcopy(model.state_dict())
    ids = torch.arange(8)
    optimized = optimize_graph(gm, (ids,))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    with torch.no_grad():
        torch.testing.assert_close(optimized(ids), copy.deepcopy(model)(ids))


def test_the_run_for_shapes_leaves_the_rng_alone():
    gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.dropout(x, 0.5, training=True) + 1)
    x = torch.randn(4, 4)
    before = torch.get_rng_state()
    optimize_graph(gm, (x,))
    assert torch.equal(torch.get_rng_state(), before)


def test_a_training_batch_norm_is_ordered_and_leaves_its_input_free():
    """A batch norm in training writes its running statistics, not its input: it stays ordered
    and opaque, and the linear feeding it is still a term the rules can batch."""
    import torch.nn.functional as F

    from optimus_eqsat.translate import running_stats_written, translate

    def model(x, w, mean, var):
        return F.batch_norm(F.linear(x, w), mean, var, training=True).relu()

    gm = torch.fx.symbolic_trace(model)
    inputs = (torch.randn(8, 4), torch.randn(6, 4), torch.zeros(6), torch.ones(6))
    t = translate(gm, inputs)
    by_name = {n.name: i for i, n in enumerate(t.nodes)}
    norm = next(n for n in t.nodes if n.name.startswith("batch_norm"))
    assert [a.name for a in running_stats_written(norm)] == ["mean", "var"]
    assert t.status[by_name[norm.name]] == "opaque" and by_name[norm.name] in t.ordered
    assert t.status[by_name["linear"]] == "term"


class DefaultedScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.towers = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])

    def forward(self, x, scale: float = 2.0):
        return torch.cat([t(x) for t in self.towers], 1) * scale


def test_a_defaulted_argument_left_out_of_the_example_inputs_takes_its_default():
    model = DefaultedScale()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(16, 8)
    out = optimize_graph(gm, (x,), raise_on_error=True, profile="h100")
    report = out.meta["optimus_eqsat"]
    assert not report.fell_back and report.launches_after < report.launches_before  # the towers batched
    torch.testing.assert_close(out(x), model(x))
    torch.testing.assert_close(out(x, 0.5), model(x, 0.5))
