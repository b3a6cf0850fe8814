"""How fast Inductor's CPU kernels write bool tensors, against float ones.

The measurement behind ``optimus_eqsat/postgrad/bool_masks.py``: each function is
compiled by Inductor alone and its generated kernel timed by the profiler
(``cpp.enable_kernel_profile``), so the wrapper's own overhead is left out.

    python -m benchmarks.bool_store [--sizes 12288,65536,786432] [--calls 200]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "x <= 0 (bool)": lambda x: x <= 0,
    "(x <= 0).float()": lambda x: (x <= 0).float(),
    "relu(x) * 2 (float)": lambda x: torch.relu(x) * 2,
    "clone of a bool tensor": lambda x: (x > 0).clone(),
}


def kernel_us(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, calls: int) -> float:
    """Microseconds per call spent in the generated kernels of ``torch.compile(fn)``."""
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    compiled = torch.compile(fn)
    for _ in range(20):
        compiled(x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            compiled(x)
    return sum(e.self_cpu_time_total for e in prof.key_averages() if "cpp_fused" in e.key) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="12288,65536,786432")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True
    print("| elements | " + " | ".join(CASES) + " |")
    print("|---" * (len(CASES) + 1) + "|")
    for size in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(size)
        cells = []
        for fn in CASES.values():
            us = kernel_us(fn, x, args.calls)
            cells.append(f"{us:.1f} us ({us * 1e3 / size:.2f} ns/elem)")
        print(f"| {size} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
