"""Dump Inductor's CUDA output code for one zoo model under each method (for calibration).

    python -m benchmarks.gpu_dump_code --model dynamic_schema --out DIR

Writes ``<model>_<method>.py`` (the output code of every compiled graph) and prints the
kernel counts next to the cost model's prediction, so kernels can be compared one by one
with ``extract.fx_cost.predict_kernels(gm, profile=...)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.methods import OPTIMUS_POST_GRAD, OPTIMUS_PRE_GRAD
from benchmarks.zoo import MODELS
from optimus_eqsat.backend import make_backend
from optimus_eqsat.inductor_count import count_inductor_kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="dynamic_schema")
    parser.add_argument("--out", default="/tmp/gpu_code")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = MODELS[args.model]
    model = spec.build().cuda()
    inputs = tuple(t.cuda() for t in spec.inputs(args.batch))
    methods = {
        "inductor": {},
        "inductor_optimus": {
            "options": {"pre_grad_fusion_options": OPTIMUS_PRE_GRAD, "post_grad_fusion_options": OPTIMUS_POST_GRAD}
        },
        "optimus_eqsat": {"backend": make_backend()},
    }
    for name, kwargs in methods.items():
        torch._dynamo.reset()
        count = count_inductor_kernels(model, inputs, **kwargs)
        (out / f"{args.model}_{name}.py").write_text("\n\n# ---- next graph ----\n\n".join(count.code))
        print(
            f"{args.model} {name}: generated {count.generated}, extern {count.extern}, total {count.total}", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
