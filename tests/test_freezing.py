"""Parameter folding for frozen-inference launch counts (extract/freezing.py)."""

import torch
from torch import nn

from optimus_eqsat import optimize_graph
from optimus_eqsat.extract.freezing import fold_parameters, parameter_placeholders
from optimus_eqsat.extract.fx_cost import predicted_launches
from optimus_eqsat.inductor_count import capture_dynamo_graph


class StackedWeights(nn.Module):
    """What batched programs look like: parameters stacked by a cat on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.ParameterList(nn.Parameter(torch.randn(8, 8)) for _ in range(4))
        self.b = nn.ParameterList(nn.Parameter(torch.randn(8)) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.stack(list(self.w))  # [4, 8, 8]
        b = torch.stack(list(self.b)).unsqueeze(1)  # [4, 1, 8]
        return torch.relu(torch.bmm(x, w.transpose(1, 2)) + b)


def test_weight_stacking_folds_and_values_match():
    torch.manual_seed(0)
    model = StackedWeights().eval()
    x = torch.randn(4, 5, 8)
    gm, example_inputs = capture_dynamo_graph(model, x)
    assert len(parameter_placeholders(gm, example_inputs)) == 8
    folded = fold_parameters(gm, example_inputs)
    stacks = [n for n in folded.graph.nodes if n.target in (torch.stack, torch.cat)]
    assert not stacks  # both parameter stacks became constants
    assert predicted_launches(folded) < predicted_launches(gm)
    with torch.no_grad():
        torch.testing.assert_close(folded(*example_inputs)[0], model(x))
    # the optimizer's own batched programs fold the same way and keep their values
    batched = optimize_graph(gm, profile="h100")
    with torch.no_grad():
        torch.testing.assert_close(fold_parameters(batched, example_inputs)(*example_inputs)[0], model(x))


def test_nothing_to_fold_without_parameters():
    def f(x):
        return torch.cat([x.relu(), x.sigmoid()], 1)

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(2, 3)
    folded = fold_parameters(gm, [x])
    assert [n.op for n in folded.graph.nodes] == [n.op for n in gm.graph.nodes]
    torch.testing.assert_close(folded(x), f(x))


def test_input_graph_untouched_and_dropout_not_folded():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3))

        def forward(self, x):
            return x * torch.nn.functional.dropout(self.w * 2, 0.5, training=True)

    gm = torch.fx.symbolic_trace(M())
    before = [n.name for n in gm.graph.nodes]
    folded = fold_parameters(gm, [torch.randn(3)])
    assert [n.name for n in gm.graph.nodes] == before
    # w * 2 is folded (a get_attr parameter), dropout stays a runtime op
    assert any("dropout" in str(n.target) for n in folded.graph.nodes)
    assert any(n.op == "get_attr" and n.target.startswith("_frozen_") for n in folded.graph.nodes)
