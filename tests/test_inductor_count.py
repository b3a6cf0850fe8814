"""Counting Inductor's kernels, and the launch model against real counts (CPU)."""

from __future__ import annotations

import torch
from torch import nn

from optimus_eqsat.extract.fx_cost import predicted_launches
from optimus_eqsat.inductor_count import (
    capture_dynamo_graphs,
    count_inductor_kernels,
    count_kernels_in_code,
    split_fusion_options,
)

FAKE_CODE = '''
cpp_fused_relu_0 = async_compile.cpp_pybinding(['float*'], r"""kernel""")
triton_poi_fused_add_1 = async_compile.triton('triton_poi_fused_add_1', """@triton.jit""")
class Runner:
    def call(self, args):
        arg0_1, = args
        # Original ATen: [aten.addmm]
        extern_kernels.addmm(arg2_1, arg0_1, arg1_1, alpha=1, beta=1, out=buf0)
        cpp_fused_relu_0(buf0)
        buf1 = torch.ops.aten._embedding_bag.default(arg3_1, arg4_1)
        assert_size_stride(buf1, (3, 16), (16, 1), 'torch.ops.aten._embedding_bag.default')
        triton_poi_fused_add_1.run(buf0, buf2, 16, stream=stream0)
        cpp_fused_relu_0(buf2)
        return (buf0, )
runner = Runner(partitions=[])
'''


def test_count_kernels_in_code_counts_launches():
    generated, extern = count_kernels_in_code(FAKE_CODE)
    assert generated == 3  # cpp kernel launched twice + one triton launch
    assert extern == 2  # addmm + the aten fallback; the string in an assert is not a call


def test_split_fusion_options_routes_pre_and_post():
    pre, post = split_fusion_options({"batch_linear": {}, "batch_aten_add": {}, "split_cat_pass": {}})
    assert set(pre) == {"batch_linear", "split_cat_pass"} and set(post) == {"batch_aten_add"}


class PointwiseChain(nn.Module):
    def forward(self, x):
        return torch.tanh(x.relu() + 1)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.a(x).relu()).sigmoid()


class Towers(nn.Module):
    """Split -> per-piece linear+relu -> cat -> layer norm."""

    def __init__(self, n: int = 3):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))
        self.ln = nn.LayerNorm(4 * n)

    def forward(self, x):
        parts = x.split(4, dim=1)
        return self.ln(torch.cat([l(p).relu() for l, p in zip(self.lins, parts)], dim=1))


def test_real_counts_pointwise_and_mlp():
    chain = count_inductor_kernels(PointwiseChain(), (torch.randn(4, 8),))
    assert (chain.generated, chain.extern, chain.total) == (1, 0, 1)
    assert chain.code and "cpp_fused" in chain.code[0]
    mlp = count_inductor_kernels(Mlp(), (torch.randn(4, 8),))
    assert mlp.extern == 2 and mlp.generated == 2


def test_prediction_matches_inductor_on_tiny_models():
    for model, inputs in [
        (PointwiseChain(), (torch.randn(4, 8),)),
        (Mlp(), (torch.randn(4, 8),)),
        (Towers(), (torch.randn(4, 12),)),
    ]:
        graphs = capture_dynamo_graphs(model.eval(), inputs)
        predicted = sum(predicted_launches(gm, profile="cpu") for gm in graphs)
        assert predicted == count_inductor_kernels(model, inputs).total, type(model).__name__


def test_training_counts_forward_and_backward():
    count = count_inductor_kernels(Mlp(), (torch.randn(4, 8),), training=True)
    assert len(count.code) == 2  # forward and backward graphs
    assert count.extern >= 2 + 3  # forward addmms plus backward matmuls


def test_inductor_optimus_options_apply():
    from torch._dynamo.utils import counters

    class Parallel(nn.Module):
        def forward(self, xs):
            # batch_relu matches F.relu only (not Tensor.relu / torch.relu)
            return [nn.functional.relu(torch.tanh(x)) for x in xs]

    xs = [torch.randn(4, 4) for _ in range(6)]
    counters.clear()
    # no FX graph cache: on a cache hit the pre-grad passes (and counters) do not run
    count = count_inductor_kernels(
        Parallel(),
        (xs,),
        options={"fx_graph_cache": False},
        fusion_options={"batch_relu": {}, "batch_tanh": {}},
    )
    assert count.total >= 1
    assert counters["inductor"]["batch_relu"] == 1 and counters["inductor"]["batch_tanh"] == 1
    assert torch._inductor.config.pre_grad_fusion_options == {}  # patch undone


def test_custom_op_fallbacks_count_as_extern_launches():
    code = (
        "triton_poi_fused_0 = async_compile.triton('k')\n"
        "def call(args):\n"
        "    buf0 = torch.ops.optimus_eqsat.grouped_linear.default([a, b], [c, d], [e, f])\n"
        "    buf1 = torch.ops.inductor._alloc_from_pool(x)\n"
        "    triton_poi_fused_0.run(buf0)\n"
        "    extern_kernels.mm(a, b, out=c)\n"
        "    return buf0\n"
    )
    assert count_kernels_in_code(code) == (1, 2)  # the grouped call and the mm; not the pool allocation
