"""Models from maintained recommendation libraries, compiled as a new user would.

``torch.compile(model, backend="optimus_eqsat")`` on the CTR and multi-task models
of torch-rechub and deepctr-torch, models composed of FuxiCTR's own layers the way its
model zoo composes them (the zoo is not in its package), and Hugging Face transformers'
BERT, GPT-2, Mixtral and Qwen2-MoE (whichever is installed: ``pip install torch-rechub
deepctr-torch fuxictr transformers``; none is a dependency of this project), small
configurations with random inputs:

- ``--check``: outputs, gradients (training) and floating buffers after the step of
  the optimized program, without the measured choice so the optimizer's own program
  runs, and of the default backend (``measured_*``: the choice times steps on the first
  call and must leave the running statistics alone), against eager; a gradient counts
  as wrong past ``1e-4`` of the largest gradient of the model (batch norm makes the
  bias gradients before it float noise around zero);
- ``--time``: step time of the default backend (measured choice on) against
  Inductor default's, in interleaved rounds (:mod:`benchmarks.rounds`).

    python -m benchmarks.library_models --check --time --batches 256 --threads 1 \\
        --out benchmarks/results/library
"""

from __future__ import annotations

import argparse
import copy
import csv
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.measure import flat_outputs, make_step, timed_step
from benchmarks.rounds import RoundPlan, run_rounds

Case = tuple[torch.nn.Module, tuple[Any, ...]]  # a model and its positional inputs


def _rechub_builders() -> dict[str, Callable[[int], Case]]:
    from torch_rechub.basic.features import DenseFeature, SequenceFeature, SparseFeature
    from torch_rechub.models import multi_task as mt
    from torch_rechub.models import ranking as rk

    def case(make: Callable[..., torch.nn.Module], history: bool = False) -> Callable[[int], Case]:
        def build(batch: int) -> Case:
            sparse = [SparseFeature(f"s{i}", 100, 8) for i in range(6)]
            dense = [DenseFeature(f"d{i}") for i in range(3)]
            # a behaviour sequence and a target item, both looked up in s0's table
            extra = (
                [
                    SequenceFeature("h0", 100, 8, pooling="concat", shared_with="s0"),
                    SparseFeature("t0", 100, 8, shared_with="s0"),
                ]
                if history
                else []
            )
            model = make(sparse, dense, *extra)
            features = [*sparse, *dense, *extra]
            inputs = {
                f.name: torch.randint(0, 100, (batch, 5))
                if isinstance(f, SequenceFeature)
                else torch.randint(0, 100, (batch,))
                if isinstance(f, SparseFeature)
                else torch.randn(batch)
                for f in features
            }
            return model, (inputs,)

        return build

    mlp, towers = {"dims": [32, 16]}, [{"dims": [8]}, {"dims": [8]}]
    two = ["classification", "classification"]
    return {
        "rechub.MMOE": case(lambda s, d: mt.MMOE(s + d, two, 4, mlp, towers)),
        "rechub.PLE": case(lambda s, d: mt.PLE(s + d, two, 2, 2, 1, mlp, towers)),
        "rechub.SharedBottom": case(lambda s, d: mt.SharedBottom(s + d, two, mlp, towers)),
        "rechub.AITM": case(lambda s, d: mt.AITM(s + d, 2, mlp, towers)),
        "rechub.DeepFM": case(lambda s, d: rk.DeepFM(s + d, s, mlp)),
        "rechub.DCN": case(lambda s, d: rk.DCN(s + d, 3, mlp)),
        "rechub.DCNv2": case(lambda s, d: rk.DCNv2(s + d, 3, mlp)),
        "rechub.AutoInt": case(lambda s, d: rk.AutoInt(s, d, mlp_params=mlp)),
        "rechub.FiBiNet": case(lambda s, d: rk.FiBiNet(s, mlp)),
        "rechub.DIN": case(
            lambda s, d, seq, target: rk.DIN(s, [seq], [target], mlp, {"dims": [16], "activation": "dice"}),
            history=True,
        ),
    }


def _deepctr_builders() -> dict[str, Callable[[int], Case]]:
    import deepctr_torch.models as dc
    from deepctr_torch.inputs import DenseFeat, SparseFeat

    def case(make: Callable[[list], torch.nn.Module]) -> Callable[[int], Case]:
        def build(batch: int) -> Case:
            columns = [SparseFeat(f"s{i}", 50, embedding_dim=8) for i in range(6)] + [
                DenseFeat(f"d{i}", 1) for i in range(3)
            ]
            model = make(columns)
            x = torch.cat([torch.randint(0, 50, (batch, 6)).float(), torch.randn(batch, 3)], dim=1)
            return model, (x,)

        return build

    return {
        f"deepctr.{name}": case(make)
        for name, make in {
            "WDL": lambda c: dc.WDL(c, c),
            "DeepFM": lambda c: dc.DeepFM(c, c),
            "xDeepFM": lambda c: dc.xDeepFM(c, c),
            "DCN": lambda c: dc.DCN(c, c),
            "DCNMix": lambda c: dc.DCNMix(c, c),
            "AutoInt": lambda c: dc.AutoInt(c, c),
            "FiBiNET": lambda c: dc.FiBiNET(c, c),
            "NFM": lambda c: dc.NFM(c, c),
            "AFN": lambda c: dc.AFN(c, c),
            "MMOE": lambda c: dc.MMOE(c),
            "PLE": lambda c: dc.PLE(c),
            "ESMM": lambda c: dc.ESMM(c),
        }.items()
    }


def _fuxictr_builders() -> dict[str, Callable[[int], Case]]:
    """FuxiCTR's layers composed as its model zoo composes them: MMoE and PLE (``MLP_Block``
    experts, gates and towers with batch norm), DCNv2 (``CrossNetMix`` or
    ``CrossNetV2`` beside an ``MLP_Block``), xDeepFM (``CompressedInteractionNet``), FiBiNET
    (``SqueezeExcitation``, ``BilinearInteractionV2``) and DIN (``DIN_Attention`` with Dice over a
    masked history); the multi-task models' outputs concatenated. Eight categorical fields of
    16 dimensions, one table each, stacked as its ``FeatureEmbedding`` gives them (which needs a
    dataset's ``FeatureMap``); dropout off, the layers' default (eager and compiled draw different
    masks)."""
    from fuxictr.pytorch import layers as fx

    fields, dim, vocab = 8, 16, 100
    width = fields * dim

    def mlp(inputs: int, hidden: list[int], **kwargs: Any) -> torch.nn.Module:
        return fx.MLP_Block(inputs, hidden, "ReLU", batch_norm=True, **kwargs)

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tables = torch.nn.ModuleList(torch.nn.Embedding(vocab, dim) for _ in range(fields))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([table(x[:, i]) for i, table in enumerate(self.tables)], dim=1)

    class MMoE(torch.nn.Module):
        def __init__(self, experts: int = 4, tasks: int = 2) -> None:
            super().__init__()
            self.emb = Embed()
            self.experts = torch.nn.ModuleList(mlp(width, [64, 32]) for _ in range(experts))
            self.gates = torch.nn.ModuleList(mlp(width, [32], output_dim=experts) for _ in range(tasks))
            self.towers = torch.nn.ModuleList(mlp(32, [16], output_dim=1) for _ in range(tasks))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.emb(x).flatten(start_dim=1)
            mixed = torch.stack([expert(h) for expert in self.experts], dim=1)
            outs = [
                torch.sigmoid(tower(torch.sum(gate(h).softmax(dim=-1).unsqueeze(-1) * mixed, dim=1)))
                for gate, tower in zip(self.gates, self.towers)
            ]
            return torch.cat(outs, dim=1)

    class PLE(torch.nn.Module):
        def __init__(self, tasks: int = 2, specific: int = 2, shared: int = 2) -> None:
            super().__init__()
            self.emb = Embed()
            self.specific = torch.nn.ModuleList(
                torch.nn.ModuleList(mlp(width, [32]) for _ in range(specific)) for _ in range(tasks)
            )
            self.shared = torch.nn.ModuleList(mlp(width, [32]) for _ in range(shared))
            self.gates = torch.nn.ModuleList(
                fx.MLP_Block(width, [], output_dim=specific + shared, output_activation="softmax") for _ in range(tasks)
            )
            self.towers = torch.nn.ModuleList(
                mlp(32, [16], output_dim=1, output_activation="Sigmoid") for _ in range(tasks)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.emb(x).flatten(start_dim=1)
            shared = [expert(h) for expert in self.shared]
            outs = []
            for specific, gate, tower in zip(self.specific, self.gates, self.towers):
                experts = torch.stack([expert(h) for expert in specific] + shared, dim=1)
                outs.append(tower(torch.bmm(gate(h).unsqueeze(1), experts).squeeze(1)))
            return torch.cat(outs, dim=1)

    class DCNv2(torch.nn.Module):
        def __init__(self, mix: bool = True) -> None:
            super().__init__()
            self.emb = Embed()
            self.cross = (
                fx.CrossNetMix(width, layer_num=2, low_rank=8, num_experts=4) if mix else fx.CrossNetV2(width, 2)
            )
            self.dnn = mlp(width, [64, 32])
            self.fc = torch.nn.Linear(width + 32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.emb(x).flatten(start_dim=1)
            return torch.sigmoid(self.fc(torch.cat([self.cross(h), self.dnn(h)], dim=-1)))

    class XDeepFM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = Embed()
            self.cin = fx.CompressedInteractionNet(fields, [16, 16], output_dim=1)
            self.dnn = mlp(width, [32, 16], output_dim=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e = self.emb(x)
            return torch.sigmoid(self.cin(e) + self.dnn(e.flatten(start_dim=1)))

    class FiBiNET(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = Embed()
            self.se = fx.SqueezeExcitation(fields, 3, "ReLU")
            self.bilinear = fx.BilinearInteractionV2(fields, dim, "field_interaction")
            self.dnn = mlp(fields * (fields - 1) * dim, [32, 16], output_dim=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e = self.emb(x)
            pairs = torch.cat([self.bilinear(e), self.bilinear(self.se(e))], dim=1)
            return torch.sigmoid(self.dnn(pairs.flatten(start_dim=1)))

    class DIN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = Embed()
            self.item = torch.nn.Embedding(vocab, dim)
            self.attention = fx.DIN_Attention(dim, [32], "Dice", batch_norm=True, use_softmax=True)
            self.dnn = mlp(width + 2 * dim, [32, 16], output_dim=1)

        def forward(self, x: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
            target = self.item(x[:, 0])
            pooled = self.attention(target, self.item(history), history > 0)
            return torch.sigmoid(self.dnn(torch.cat([self.emb(x).flatten(start_dim=1), target, pooled], dim=1)))

    def case(make: Callable[[], torch.nn.Module], history: bool = False) -> Callable[[int], Case]:
        def build(batch: int) -> Case:
            ids = torch.randint(0, vocab, (batch, fields))
            return make(), ((ids, torch.randint(0, vocab, (batch, 10))) if history else (ids,))

        return build

    models: dict[str, Callable[[], torch.nn.Module]] = {
        "MMoE": MMoE,
        "PLE": PLE,
        "DCNv2Mix": DCNv2,
        "DCNv2": lambda: DCNv2(mix=False),
        "xDeepFM": XDeepFM,
        "FiBiNET": FiBiNET,
    }
    return {**{f"fuxictr.{name}": case(make) for name, make in models.items()}, "fuxictr.DIN": case(DIN, True)}


class _Output(torch.nn.Module):
    """A transformers model as a training loop calls it: token ids and an attention mask in, one
    field of its output object out (the logits of a model with a head, the last hidden state
    of an encoder without one)."""

    def __init__(self, model: torch.nn.Module, field: str = "logits") -> None:
        super().__init__()
        self.model, self.field = model, field

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=ids, attention_mask=mask), self.field)


def _transformers_builders() -> dict[str, Callable[[int], Case]]:
    """Tiny configurations of Hugging Face transformers' own models: encoders (BERT, RoBERTa,
    DistilBERT, ALBERT, DeBERTa-v2), decoders (GPT-2, GPT-NeoX, Llama, Mistral, Gemma, Phi) and
    mixtures of experts (Mixtral's and OLMoE's routed experts; Qwen2-MoE's, plus a shared
    expert; Switch Transformers' top-1 router), sequences of 16 tokens, dropout off (eager and
    compiled draw different masks)."""
    import transformers as hf

    vocab, seq = 100, 16
    small = {"vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    decoder = {**small, "num_key_value_heads": 1, "max_position_embeddings": 64}
    moe = {**decoder, "num_experts_per_tok": 2}
    configs: dict[str, Callable[[], torch.nn.Module]] = {
        "hf.Bert": lambda: hf.BertForSequenceClassification(
            hf.BertConfig(**small, intermediate_size=64, **no_dropout, num_labels=3)
        ),
        "hf.Roberta": lambda: hf.RobertaForSequenceClassification(
            hf.RobertaConfig(**small, intermediate_size=64, **no_dropout, max_position_embeddings=64)
        ),
        "hf.DistilBert": lambda: hf.DistilBertForSequenceClassification(
            hf.DistilBertConfig(
                vocab_size=vocab,
                dim=32,
                n_layers=2,
                n_heads=2,
                hidden_dim=64,
                dropout=0.0,
                attention_dropout=0.0,
                seq_classif_dropout=0.0,
            )
        ),
        "hf.Albert": lambda: hf.AlbertForSequenceClassification(
            hf.AlbertConfig(**small, embedding_size=16, intermediate_size=64, **no_dropout, classifier_dropout_prob=0.0)
        ),
        "hf.DebertaV2": lambda: hf.DebertaV2ForSequenceClassification(
            hf.DebertaV2Config(**small, intermediate_size=64, **no_dropout, max_position_embeddings=64)
        ),
        "hf.GPTNeoX": lambda: hf.GPTNeoXForCausalLM(
            hf.GPTNeoXConfig(**small, intermediate_size=64, max_position_embeddings=64)
        ),
        "hf.Llama": lambda: hf.LlamaForCausalLM(hf.LlamaConfig(**decoder, intermediate_size=48)),
        "hf.Mistral": lambda: hf.MistralForCausalLM(hf.MistralConfig(**decoder, intermediate_size=48)),
        "hf.Gemma": lambda: hf.GemmaForCausalLM(hf.GemmaConfig(**decoder, intermediate_size=48, head_dim=16)),
        "hf.Phi": lambda: hf.PhiForCausalLM(
            hf.PhiConfig(**decoder, intermediate_size=48, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)
        ),
        "hf.OLMoE": lambda: hf.OlmoeForCausalLM(hf.OlmoeConfig(**moe, intermediate_size=48, num_experts=4)),
        "hf.Switch": lambda: hf.SwitchTransformersEncoderModel(
            hf.SwitchTransformersConfig(
                vocab_size=vocab,
                d_model=32,
                d_kv=16,
                d_ff=64,
                num_layers=2,
                num_heads=2,
                num_experts=4,
                dropout_rate=0.0,
            )
        ),
        "hf.GPT2": lambda: hf.GPT2LMHeadModel(
            hf.GPT2Config(
                vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
            )
        ),
        "hf.Mixtral": lambda: hf.MixtralForCausalLM(hf.MixtralConfig(**moe, intermediate_size=48, num_local_experts=4)),
        "hf.Qwen2Moe": lambda: hf.Qwen2MoeForCausalLM(
            hf.Qwen2MoeConfig(
                **moe, intermediate_size=48, moe_intermediate_size=24, shared_expert_intermediate_size=48, num_experts=4
            )
        ),
    }

    headless = {"hf.Switch"}  # (an encoder without a head: its last hidden state)

    def case(make: Callable[[], torch.nn.Module], field: str) -> Callable[[int], Case]:
        def build(batch: int) -> Case:
            ids = torch.randint(0, vocab, (batch, seq))
            return _Output(make(), field), (ids, torch.ones_like(ids))

        return build

    return {name: case(make, "last_hidden_state" if name in headless else "logits") for name, make in configs.items()}


def library_cases() -> dict[str, Callable[[int], Case]]:
    """Builders (batch -> model, inputs) of every installed library's models."""
    cases: dict[str, Callable[[int], Case]] = {}
    for builders in (_rechub_builders, _deepctr_builders, _fuxictr_builders, _transformers_builders):
        try:
            cases.update(builders())
        except ImportError as exc:
            logging.getLogger(__name__).warning("skipping a library: %s", exc)
    return cases


def _loss(out: Any) -> torch.Tensor:
    return sum(o.float().sum() for o in flat_outputs(out))


def check(build: Callable[[int], Case], batch: int, training: bool, measure: bool = False) -> dict[str, Any]:
    """The optimizer's program (``measure=False``: no measured choice) or the default backend
    against eager: largest output error, largest gradient error relative to the model's largest
    gradient, and largest error of a floating buffer after the step (a batch norm's running
    statistics: the measured choice times steps on the first call, and must leave them alone)."""
    from optimus_eqsat.backend import make_backend

    torch.manual_seed(0)
    model, inputs = build(batch)
    model.train(training)
    ours = copy.deepcopy(model)
    backend = make_backend(measure=measure)
    torch._dynamo.reset()
    with torch.set_grad_enabled(training):
        want = model(*inputs)
        got = torch.compile(ours, backend=backend)(*inputs)
    row = {
        "output_err": (got - want).abs().max().item(),
        "grad_err": 0.0,
        "fallback": "; ".join(r.fallback_reason for r in backend.reports if r.fallback_reason),
    }
    if training:
        _loss(want).backward()
        _loss(got).backward()
        scale = max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None) or 1.0
        for p, q in zip(model.parameters(), ours.parameters()):
            if (p.grad is None) != (q.grad is None):
                row["grad_err"] = float("inf")
            elif p.grad is not None:
                row["grad_err"] = max(row["grad_err"], (p.grad - q.grad).abs().max().item() / scale)
    row["buffer_err"] = max(
        [
            (a - b).abs().max().item()
            for a, b in zip(model.buffers(), ours.buffers())
            if a.is_floating_point() and a.numel()
        ],
        default=0.0,
    )
    return row


def time_step(
    build: Callable[[int], Case], batch: int, training: bool, plan: RoundPlan, clock: str = "wall"
) -> dict[str, Any]:
    """Step time of the default backend and of Inductor, interleaved: medians and the paired ratio
    (``clock``: :func:`benchmarks.measure.timed_step`'s)."""
    steps, compile_s = {}, {}
    for method in ("inductor", "optimus_eqsat"):
        torch.manual_seed(0)
        model, inputs = build(batch)
        model.train(training)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=method)
        step = make_step(lambda *xs, c=compiled: c(*xs), model, inputs, training)
        start = time.perf_counter()
        step()  # compiles (and, for ours, runs the measured choice)
        compile_s[method] = time.perf_counter() - start
        steps[method] = timed_step(step, "cpu", clock)
    rounds = run_rounds(steps, plan, baseline="inductor")
    ratios = rounds.ratios("inductor")["optimus_eqsat"]
    deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else [ratios[0]] * 9
    return {
        "inductor_ms": statistics.median(rounds.round_ms["inductor"]),
        "ours_ms": statistics.median(rounds.round_ms["optimus_eqsat"]),
        "ratio": statistics.median(ratios),
        "ratio_p10": deciles[0],
        "ratio_p90": deciles[-1],
        "rounds": len(ratios),
        "first_call_s_inductor": compile_s["inductor"],
        "first_call_s_ours": compile_s["optimus_eqsat"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated names (default: all installed)")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--batches", default="256")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--max-rounds", type=int, default=20)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: this process's CPU time (one thread; a shared machine's preemption not counted)",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for library.csv")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = library_cases()
    names = [n for n in args.models.split(",") if n] or list(cases)
    plan = RoundPlan(max_rounds=args.max_rounds, max_seconds=60.0)
    rows = []
    for name in names:
        for mode in args.modes.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                row: dict[str, Any] = {"model": name, "mode": mode, "batch": batch}
                try:
                    if args.check:
                        row.update(check(cases[name], batch, mode == "training"))
                        measured = check(cases[name], batch, mode == "training", measure=True)
                        row.update({f"measured_{k}": v for k, v in measured.items() if k != "fallback"})
                    if args.time:
                        row.update(time_step(cases[name], batch, mode == "training", plan, args.clock))
                except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end of the run
                    row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                print({k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items()}, flush=True)
                rows.append(row)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        keys = list(dict.fromkeys(k for row in rows for k in row))
        with open(args.out / "library.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, keys)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
