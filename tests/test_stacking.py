"""Stacked parameters (optimus_eqsat.stacking): the layout, training against the unstacked
model, checkpoints, hooks, tied weights, and the compiled program reading the stacks."""

from __future__ import annotations

import copy
import gc
import io
import weakref

import pytest
import torch
from torch import nn

from optimus_eqsat import stack_parameters, unstack_parameters
from optimus_eqsat.stacking import StackedGroup, stack_groups, stacked_groups


class Experts(nn.Module):
    """Four same-shaped MLP experts mixed by a softmax gate: what a batched program stacks."""

    def __init__(self, n: int = 4, d: int = 16, h: int = 32, out: int = 8) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, out)) for _ in range(n))
        self.gate = nn.Linear(d, n)
        self.norm = nn.LayerNorm(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = torch.stack([e(x) for e in self.experts], dim=1)
        weights = torch.softmax(self.gate(x), dim=-1).unsqueeze(-1)
        return self.norm((weights * outs).sum(dim=1))


# weights and first biases as stacks on ``experts`` (the first weights transposed, as a batched
# linear reads them); the last biases and the gate's bias
# concatenated on the root (one module's parameters in groups of two owners)
PLAN = [
    ("stack-t", [f"experts.{k}.0.weight" for k in range(4)]),
    ("stack", [f"experts.{k}.0.bias" for k in range(4)]),
    ("stack", [f"experts.{k}.2.weight" for k in range(4)]),
    ("cat", [*(f"experts.{k}.2.bias" for k in range(4)), "gate.bias"]),
]


def _model(seed: int = 0) -> Experts:
    torch.manual_seed(seed)
    return Experts()


def _inputs(batch: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 16, generator=torch.Generator().manual_seed(seed))


def _stacked(seed: int = 0) -> tuple[Experts, Experts]:
    """(original, a copy with PLAN stacked)."""
    ref = _model(seed)
    model = copy.deepcopy(ref)
    assert len(stack_groups(model, PLAN)) == len(PLAN)
    return ref, model


def _member_grads(model: nn.Module, ref: nn.Module) -> dict[str, torch.Tensor]:
    """Each of ``ref``'s parameter names with its gradient in ``model`` (a slot of a stack's)."""
    grads = {name: p.grad for name, p in model.named_parameters()}
    for group in stacked_groups(model):
        stack = model.get_parameter(group.path)
        offset = 0
        for k, member in enumerate(group.members):
            if group.kind == "stack":
                grads[member] = stack.grad[k].t() if group.transposed else stack.grad[k]
            else:
                n = ref.get_parameter(member).shape[0]
                grads[member] = stack.grad[offset : offset + n]
                offset += n
    return grads


def test_layout_reads_the_same_values_with_fewer_leaves() -> None:
    ref, model = _stacked()
    groups = {g.path: g for g in stacked_groups(model)}
    assert set(groups) == {
        "experts._optimus_stack0_weight",
        "experts._optimus_stack0_bias",
        "experts._optimus_stack1_weight",
        "_optimus_stack0_bias",
    }
    assert groups["_optimus_stack0_bias"] == StackedGroup("", "_optimus_stack0_bias", tuple(PLAN[3][1]), "cat")
    first = model.get_parameter("experts._optimus_stack0_weight")
    assert first.shape == (4, 16, 32) and first.is_contiguous()  # the members transposed
    assert groups["experts._optimus_stack0_weight"].transposed
    assert model.get_parameter("experts._optimus_stack1_weight").is_contiguous()
    assert model.get_parameter("_optimus_stack0_bias").shape == (4 * 8 + 4,)
    # 4 * 4 + 2 + 2 + 2 parameters -> 4 stacks, the gate's weight and the norm's two
    assert len(list(model.parameters())) == 7
    for name, p in ref.named_parameters():
        module, _, attr = name.rpartition(".")
        got = getattr(model.get_submodule(module), attr)
        assert got.shape == p.shape and torch.equal(got, p), name
    # a member is a view of its stack: a write to the stack is what the member reads
    with torch.no_grad():
        model.get_parameter("experts._optimus_stack0_weight")[2].fill_(3.0)
    assert (model.experts[2][0].weight == 3.0).all()
    assert isinstance(model.experts[2][0], nn.Linear)


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.Adam(ps, lr=0.01),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    ],
    ids=["sgd", "adam", "adamw"],
)
def test_training_steps_equal_the_unstacked_model(make_opt) -> None:
    ref, model = _stacked()
    opt_ref, opt = make_opt(ref.parameters()), make_opt(model.parameters())
    for step in range(4):
        x = _inputs(seed=step)
        for m, o in ((ref, opt_ref), (model, opt)):
            o.zero_grad(set_to_none=True)
            m(x).pow(2).sum().backward()
        grads = _member_grads(model, ref)
        for name, p in ref.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=0, msg=name)
        opt_ref.step()
        opt.step()
    torch.testing.assert_close(model.state_dict(), ref.state_dict(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(model(_inputs()), ref(_inputs()), rtol=1e-6, atol=1e-7)


def test_compiled_training_equals_the_unstacked_model() -> None:
    """Compiled with our backend (the batched program kept, measure=False), against the
    unstacked model in eager. Gradients differ by float rounding (a bmm sums in another order
    than n mms: ~1e-4 of the largest); Adam's ``eps`` is raised so that such noise on a
    near-zero gradient does not flip its update's sign."""
    from optimus_eqsat.backend import make_backend

    ref, model = _stacked()
    backend = make_backend(measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-3)
    x = _inputs()
    for _ in range(3):
        for m, o in ((ref, opt_ref), (compiled, opt)):
            o.zero_grad(set_to_none=True)
            m(x).pow(2).mean().backward()
        grads = _member_grads(model, ref)
        for name, p in ref.named_parameters():
            scale = p.grad.abs().max().item()
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-3, atol=1e-3 * scale, msg=name)
        opt_ref.step()
        opt.step()
    assert backend.reports[0].batched and not backend.reports[0].fell_back
    torch.testing.assert_close(model.state_dict(), ref.state_dict(), rtol=1e-4, atol=1e-5)


def test_state_dict_keeps_the_original_keys_order_and_values() -> None:
    ref, model = _stacked()
    want, got = ref.state_dict(), model.state_dict()
    assert list(got) == list(want)
    for key in want:
        assert got[key].shape == want[key].shape and torch.equal(got[key], want[key]), key
    assert list(model.experts[1].state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_load_state_dict_of_an_old_checkpoint() -> None:
    _, model = _stacked()
    old = _model(seed=5)  # another model's checkpoint, saved in the original layout
    result = model.load_state_dict(old.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    for key, value in old.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    x = _inputs()
    torch.testing.assert_close(model(x), old(x), rtol=0, atol=0)
    # assign=True assigns what is not stacked and copies into the slots
    newer = _model(seed=6)
    model.load_state_dict(newer.state_dict(), assign=True)
    torch.testing.assert_close(model(x), newer(x), rtol=0, atol=0)
    assert len(stacked_groups(model)) == len(PLAN)
    # mistakes are reported as for the original model
    partial = {k: v for k, v in old.state_dict().items() if k != "experts.1.0.weight"}
    assert model.load_state_dict(partial, strict=False) == _model().load_state_dict(partial, strict=False)
    with pytest.raises(RuntimeError, match="Missing key.*experts.1.0.weight"):
        model.load_state_dict(partial)
    wrong = {**old.state_dict(), "experts.2.2.bias": torch.zeros(3)}
    with pytest.raises(RuntimeError, match="size mismatch for experts.2.2.bias"):
        model.load_state_dict(wrong)
    with pytest.raises(RuntimeError, match="Unexpected key.*extra"):
        model.load_state_dict({**old.state_dict(), "experts.0.0.extra": torch.zeros(1)})


def test_unstack_restores_the_original_layout() -> None:
    ref, model = _stacked()
    with torch.no_grad():
        model.get_parameter("experts._optimus_stack0_weight").add_(1.0)
    unstack_parameters(model)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert type(model.experts[0][0]) is nn.Linear and stacked_groups(model) == []
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.is_leaf and p.shape == q.shape, name
        assert torch.equal(p, q + 1.0 if name.endswith("0.weight") and name.startswith("experts") else q), name
    assert list(model.state_dict()) == list(ref.state_dict())
    assert all(p.is_contiguous() for p in model.parameters())
    assert (
        model.experts[0][0].weight.untyped_storage().data_ptr()
        != model.experts[1][0].weight.untyped_storage().data_ptr()
    )


def test_hooks_on_a_stacked_module_still_fire() -> None:
    _, model = _stacked()
    fired = []
    layer = model.experts[1][0]
    layer.register_forward_pre_hook(lambda m, args: fired.append("pre"))
    layer.register_forward_hook(lambda m, args, out: fired.append("forward"))
    layer.register_full_backward_hook(lambda m, gin, gout: fired.append("backward"))
    model(_inputs()).sum().backward()
    assert fired == ["pre", "forward", "backward"]


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_copies_keep_their_own_stacks(how: str) -> None:
    _, model = _stacked()
    if how == "deepcopy":
        twin = copy.deepcopy(model)
    else:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        twin = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(twin(_inputs()), model(_inputs()), rtol=0, atol=0)
    with torch.no_grad():
        twin.get_parameter("experts._optimus_stack0_weight").zero_()
    assert (twin.experts[0][0].weight == 0).all() and not (model.experts[0][0].weight == 0).all()
    assert list(twin.state_dict()) == list(model.state_dict())


def test_exclude_leaves_groups_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from optimus_eqsat import stacking

    monkeypatch.setattr(stacking, "planned_groups", lambda model, inputs, **options: PLAN)
    model = stack_parameters(_model(), _inputs(), exclude=lambda path: path.endswith("bias"))
    assert [g.members for g in stacked_groups(model)] == [tuple(PLAN[0][1]), tuple(PLAN[2][1])]


def test_tied_and_aliased_parameters_are_left_alone() -> None:
    model = _model()
    model.experts[3][0].weight = model.experts[0][0].weight  # tied: one parameter, two names
    with torch.no_grad():  # aliased: a parameter viewing another's storage
        model.experts[3][2].weight = nn.Parameter(model.experts[2][2].weight.detach().view(8, 32))
    stacked = stack_groups(model, PLAN)
    assert [g.members for g in stacked] == [tuple(PLAN[1][1]), tuple(PLAN[3][1])]
    assert model.experts[0][0].weight is model.experts[3][0].weight
    assert isinstance(model.experts[2][2].weight, nn.Parameter)


def _parameter_copies(model: nn.Module, x: torch.Tensor) -> tuple[list[str], float]:
    """Non-view nodes that the optimizer's training program for ``model`` computes from
    parameters alone (a stack or cat of weights: a copy every step), and the program's
    predicted step time."""
    from optimus_eqsat import optimize_graph
    from optimus_eqsat.extract.freezing import parameter_values
    from optimus_eqsat.fxvocab import VIEW_OPS
    from optimus_eqsat.fxvocab.names import canonical_name
    from optimus_eqsat.stacking import _training_graphs

    copies, cost = [], 0.0
    for gm, inputs in _training_graphs(model, (x,)):
        program = optimize_graph(gm, inputs, mode="training", raise_on_error=True)
        report = program.meta["optimus_eqsat"]
        assert report.batched and not report.fell_back
        cost += report.cost_after
        for node, _ in parameter_values(program, inputs).items():
            if node.op in ("call_function", "call_method") and canonical_name(node) not in VIEW_OPS:
                copies.append(node.format_node())
    return copies, cost


def test_stack_parameters_makes_the_batched_program_read_the_stacks() -> None:
    """The optimizer batches the experts and stacks their weights every step; once they are
    stacked, the batched program reads the stacks through views (the e-graph folds
    ``stack(W[0], ..., W[n-1])`` to ``W``), copies no parameter and is priced without copies."""
    model, x = _model(), _inputs(batch=64)
    copies, cost = _parameter_copies(model, x)
    assert copies, "the unstacked program should stack the experts' weights"
    ref = copy.deepcopy(model)
    replaced = weakref.ref(model.experts[0][2].weight)
    stack_parameters(model, (x,))
    assert any(g.owner == "experts" and g.kind == "stack" for g in stacked_groups(model))
    gc.collect()
    assert replaced() is None  # nothing (Dynamo's cache of the planning compile) keeps it alive
    copies, stacked_cost = _parameter_copies(model, x)
    assert copies == []
    assert stacked_cost < cost  # the copies are no longer priced
    # (a weight stored transposed takes another GEMM path: equal up to float rounding)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-6)
    assert model.state_dict().keys() == ref.state_dict().keys()


def test_ddp_and_fsdp2_train_the_stack_as_an_ordinary_parameter() -> None:
    """One process (gloo, world size 1): DDP and FSDP2's ``fully_shard`` take the stacks as
    they take any parameter; gradients and state-dict keys are the unstacked model's."""
    import socket

    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable or already initialized")
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        ref, model = _stacked()
        x = _inputs()
        ref(x).sum().backward()
        ddp = DistributedDataParallel(copy.deepcopy(model))
        ddp(x).sum().backward()
        sharded = copy.deepcopy(model)
        fully_shard(sharded)
        sharded(x).sum().backward()
        for wrapped in (ddp.module, sharded):
            grads = _member_grads(wrapped, ref)
            for name, p in ref.named_parameters():
                grad = grads[name].full_tensor() if hasattr(grads[name], "full_tensor") else grads[name]
                torch.testing.assert_close(grad, p.grad, rtol=0, atol=0, msg=name)
            assert list(wrapped.state_dict()) == list(ref.state_dict())
    finally:
        dist.destroy_process_group()
