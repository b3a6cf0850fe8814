"""The notebook explorer: one optimization kept whole, inspected and steered.

What it can and cannot say about *why* a node was rewritten: egglog 13.2's
Python bindings build e-graphs without proof recording (``EGraph()`` takes no
proof switch, and ``(prove ...)`` on such an e-graph panics), so no rewrite
chain is available. The explorer shows instead, for a node's e-class: the
term that was loaded for the FX node, the chosen e-node, every alternative
with its price, and the rules that *fired* and whose right-hand side builds
the chosen constructor (or, when the chosen node is another node's original
term, the fired rules that merge classes). Those candidates are a static
over-approximation, not a derivation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from typing import Any, TypeAlias, cast

import pandas as pd
import torch
import torch.fx as fx

from optimus_eqsat.api import OptimizationRun, OptimizeOptions
from optimus_eqsat.egraph_export import EMITTED, TermNode
from optimus_eqsat.explore import history as hist
from optimus_eqsat.explore.display import Code, Picture, SideBySide, esc, html_table
from optimus_eqsat.explore.egraph_view import neighbourhood_picture, parents_index
from optimus_eqsat.explore.fx_view import fx_picture
from optimus_eqsat.explore.rules import RuleInfo, catalogue, without_rules
from optimus_eqsat.explore.steering import Steering
from optimus_eqsat.explore.terms import TermIndex, class_names, expression, node_text
from optimus_eqsat.explore.verify import ExportMismatch, check_same
from optimus_eqsat.extract.egraph import Extraction, ExtractionError, dag_cost
from optimus_eqsat.extract.fx_cost import predict_kernels
from optimus_eqsat.fx_graphs import op_count
from optimus_eqsat.rebuild import propagate_meta, rebuild
from optimus_eqsat.rewrites import shape_rules
from optimus_eqsat.term import OP_CTORS
from optimus_eqsat.translate import NodeStatus

__all__ = ["Explorer", "SteeringError", "ExportMismatch"]

Target: TypeAlias = "int | str | fx.Node"


class SteeringError(ValueError):
    """A pin or forbid left no valid program (the steering change is undone)."""


class Explorer:
    """Saturate and extract ``gm`` once; inspect, steer, compare and export the result.

    ``Explorer(gm, example_inputs=None, **optimize_options)`` takes the options
    of :func:`optimus_eqsat.optimize_graph`. ``gm`` may also be an
    ``nn.Module`` (traced with ``torch.fx.symbolic_trace``). Example inputs are
    needed for shapes (if the graph has no shape meta) and for :meth:`export`.

    Inspect: :meth:`history`, :meth:`matches`, :meth:`rules`, :meth:`rules_fired`,
    :meth:`plot_history`, :meth:`plot_rules`, :meth:`rewritten`,
    :meth:`replaced`, :meth:`alternatives`, :meth:`most_alternatives`,
    :meth:`picture`, :meth:`side_by_side`, :meth:`code`, :meth:`neighbourhood`.

    Steer: :meth:`pin`, :meth:`forbid`, :meth:`clear_steering` (each re-extracts
    at once, without re-saturating), :meth:`reextract`, :meth:`ban_rule`
    (re-saturates). Then :meth:`compare` and :meth:`export`.

    Attributes: ``run`` (the :class:`~optimus_eqsat.api.OptimizationRun`),
    ``default`` (the first extraction), ``steered`` (the latest re-extraction,
    None until there is one), ``steering`` (pins and forbids), ``banned``.
    "Rewrite chains" are not available (see the module docstring): candidate
    rules are reported instead.
    """

    def __init__(
        self, gm: fx.GraphModule | torch.nn.Module, example_inputs: Sequence[Any] | None = None, **optimize_options: Any
    ):
        if not isinstance(gm, fx.GraphModule):
            gm = fx.symbolic_trace(gm)
        self.gm, self.example_inputs = gm, example_inputs
        self.options = OptimizeOptions.from_kwargs(**{"record_eclasses": True, **optimize_options})
        self.steering = Steering()
        self.banned: set[str] = set()
        self._saturate()

    # ------------------------------------------------------------------ phases
    def _saturate(self) -> None:
        # Banned rules are cut out of the rule programs the run loads.
        rulesets = [without_rules(r, self.banned) for r in self.options.egglog_rulesets()] if self.banned else None
        self.run = OptimizationRun(self.gm, self.example_inputs, self.options, rulesets=rulesets)
        self.run.saturate()
        self.run.extract()
        self.default = self.run.extraction
        self.steered: Extraction | None = None
        self.steered_extractor: str | None = None
        self._graphs: dict[str, fx.GraphModule] = {}
        self._kernels: dict[str, list] = {}
        for name in ("terms", "names", "parents", "originals"):
            self.__dict__.pop(name, None)

    def reextract(self, extractor: str | None = None) -> Explorer:
        """Extract again from the same e-graph (no re-saturation), honouring pins and forbids.

        ``extractor``: "greedy", "ilp" or "auto" (default: the run's option).
        """
        cost = self.steering.cost(self.run.egraph, self.run.cost) if self.steering else self.run.cost
        self.run.extract(cost=cost, extractor=extractor)
        if not math.isfinite(self.run.extraction.cost):
            raise ExtractionError("no finite-cost program under this steering")
        self.steered, self.steered_extractor = self.run.extraction, extractor or self.options.extractor
        self._graphs.pop("steered", None)
        self._kernels.pop("steered", None)
        return self

    @property
    def egraph(self):
        return self.run.egraph

    @property
    def choice(self) -> dict[int, int]:
        """The current program: the steered extraction if any, else the default."""
        return (self.steered or self.default).choice

    # ------------------------------------------------------------------ lookups
    @cached_property
    def terms(self) -> TermIndex:
        return TermIndex(self.run.translation, self.run.egraph)

    @cached_property
    def names(self) -> dict[int, list[str]]:
        return class_names(self.run.translation, self.run.egraph)

    @cached_property
    def parents(self) -> dict[int, set[int]]:
        return parents_index(self.run.egraph)

    @cached_property
    def originals(self) -> dict[tuple[int, int], list[str]]:
        """(class, node index) of every loaded FX term -> the FX node names."""
        t = self.run.translation
        out: dict[tuple[int, int], list[str]] = {}
        for i in range(len(t.gm.graph.nodes)):
            found = (
                self.terms.original_enode(i)
                if t.status.get(i) in (NodeStatus.TERM, NodeStatus.LEAF, NodeStatus.OPAQUE)
                else None
            )
            if found is not None:
                out.setdefault(found, []).append(t.nodes[i].name)
        return out

    def _fx_index(self, name: str) -> int:
        t = self.run.translation
        for i, n in enumerate(t.nodes):
            if n.name == name or t.param_leaves.get(i) == name:
                return i
        raise KeyError(f"no FX node named {name!r}")

    def eclass(self, target: Target) -> int:
        """The e-class of an FX node (by name or Node) or an e-class index (checked)."""
        if isinstance(target, fx.Node):
            target = target.name
        if isinstance(target, int):
            if not 0 <= target < len(self.egraph.classes):
                raise KeyError(f"e-class {target} out of range (0..{len(self.egraph.classes) - 1})")
            return target
        i = self._fx_index(target)
        t = self.run.translation
        if i not in self.egraph.class_of_id:
            status = t.status.get(i)
            if status == NodeStatus.PIECES:
                users = ", ".join(u.name for u in t.nodes[i].users)
                raise KeyError(f"{target!r} is a split: it has no e-class of its own; its pieces are {users}")
            raise KeyError(f"{target!r} ({status}) has no e-class")
        return self.egraph.class_of_id[i]

    def _node_index(self, c: int, node: int | str, target: Target | None = None) -> int:
        if node == "original":
            if isinstance(target, (str, fx.Node)):
                own = self.terms.original_enode(self._fx_index(cast(str, getattr(target, "name", target))))
                if own is None:
                    raise KeyError(f"the term loaded for {target!r} is no longer in the e-graph")
                return own[1]
            found = [k for (cc, k) in self.originals if cc == c]
            if not found:
                raise KeyError(f"e-class {c} holds no loaded FX term")
            return found[0]
        if not isinstance(node, int) or not 0 <= node < len(self.egraph.classes[c]):
            raise KeyError(f"e-class {c} has nodes 0..{len(self.egraph.classes[c]) - 1}; got {node!r}")
        return node

    # ------------------------------------------------------------------ saturation
    def history(self) -> pd.DataFrame:
        """Per iteration: e-nodes, e-classes (final only, see history_frame), seconds, matches."""
        return hist.history_frame(self.run.saturation, len(self.egraph.classes))

    def matches(self) -> pd.DataFrame:
        """Iterations x rules: matches per rule per iteration (rules that fired)."""
        return hist.matches_frame(self.run.saturation)

    @cached_property
    def catalogue(self) -> dict[str, RuleInfo]:
        """Every named rule of the selected families (before bans), plus the shape analysis."""
        return catalogue([*self.options.egglog_rulesets(), shape_rules()])

    def rules(self) -> pd.DataFrame:
        """Per rule: family, matches, seconds, fired, constructors it builds, banned."""
        return hist.rules_frame(self.run.saturation, self.catalogue, self.banned)

    def rules_fired(self) -> dict[str, int]:
        """Rule -> matches, for rules that fired."""
        return {k: int(v) for k, v in sorted(self.run.saturation.rule_matches.items(), key=lambda kv: -kv[1]) if v}

    def plot_history(self, top: int = 8):
        """matplotlib Figure: e-nodes and per-rule matches per iteration."""
        return hist.plot_history(self.run.saturation, top)

    def plot_rules(self, top: int = 20):
        """matplotlib Figure: matches and time of the busiest rules."""
        return hist.plot_rules(self.rules(), top)

    # ------------------------------------------------------------------ rewrites
    def _candidates(self, c: int, node: TermNode, k: int) -> list[str]:
        fired = self.run.saturation.rule_matches
        if (c, k) in self.originals:
            rules = [r.name for r in self.catalogue.values() if r.merges and fired.get(r.name)]
        else:
            rules = [r.name for r in self.catalogue.values() if node.ctor in r.builds and fired.get(r.name)]
        return sorted(rules, key=lambda r: -fired.get(r, 0))

    def _text(self, c: int, choice: dict[int, int], depth: int = 1) -> str:
        return expression(self.egraph, c, choice, depth, self.names)

    def _original_text(self, i: int, c: int) -> str:
        nested = self.terms.original_choice(i)
        return self._text(c, {**self.choice, **dict(nested)}, depth=2) if nested else "(not found)"

    def replaced(self, name: str | fx.Node) -> Replacement:
        """What the current program computes in place of FX node ``name``."""
        name = name.name if isinstance(name, fx.Node) else name
        c = self.eclass(name)
        i = self._fx_index(name)
        original = self.terms.original_enode(i)
        choice = self.choice
        k = choice.get(c)
        orig_text = self._original_text(i, c)
        status = self.run.translation.status.get(i)
        if status == NodeStatus.OPAQUE:
            why = self.run.translation.opaque_reasons.get(i, "")
            return Replacement(name, c, orig_text, None, f"(copied verbatim: opaque, {why})", False, [], self)
        if k is None:
            return Replacement(
                name, c, orig_text, None, "(not computed on its own: absorbed by its users)", True, [], self
            )
        node = self.egraph.classes[c][k]
        changed = original is None or original[1] != k
        rules = self._candidates(c, node, k) if changed else []
        return Replacement(name, c, orig_text, node_text(node), self._text(c, choice, 2), changed, rules, self)

    def rewritten(self, only_changed: bool = True) -> pd.DataFrame:
        """One row per FX op node: original term, chosen term, candidate rules."""
        t, choice = self.run.translation, self.choice
        rows = []
        for i, n in enumerate(t.gm.graph.nodes):
            if n.op not in ("call_function", "call_method", "call_module") or i not in self.egraph.class_of_id:
                continue
            if t.status.get(i) == NodeStatus.OPAQUE:
                continue
            c = self.egraph.class_of_id[i]
            original = self.terms.original_enode(i)
            k = choice.get(c)
            changed = original is None or k is None or original[1] != k
            if only_changed and not changed:
                continue
            node = self.egraph.classes[c][k] if k is not None else None
            rows.append(
                {
                    "node": n.name,
                    "eclass": c,
                    "original": self._original_text(i, c),
                    "chosen": self._text(c, choice) if k is not None else "(absorbed)",
                    "changed": changed,
                    "alternatives": sum(1 for m in self.egraph.classes[c] if m.ctor in EMITTED),
                    "candidate_rules": ", ".join(self._candidates(c, node, cast(int, k))[:4])  # node: k is set
                    if node is not None and changed
                    else "",
                }
            )
        cols = ["node", "eclass", "original", "chosen", "changed", "alternatives", "candidate_rules"]
        return pd.DataFrame(rows, columns=cols).set_index("node")

    def alternatives(self, target: Target) -> pd.DataFrame:
        """The e-nodes of a class with their price under ``run.cost``; chosen one(s) marked."""
        c = self.eclass(target)
        steered = self.steering.cost(self.egraph, self.run.cost) if self.steering else None
        registry = self.run.translation.registry.signatures
        rows = []
        for k, n in enumerate(self.egraph.classes[c]):
            price = self.run.cost(c, n) if n.ctor in EMITTED else math.inf
            row = {
                "node": k,
                "enode": node_text(n),
                "ctor": n.ctor,
                "cost_us": price * 1e6,
                "chosen_default": self.default.choice.get(c) == k,
                "chosen_now": self.choice.get(c) == k,
                "original_of": ", ".join(self.originals.get((c, k), [])),
                "steering": self.steering.state(c, k),
                "op": registry.get(n.args[0], "") if n.ctor in OP_CTORS else "",
                "built_by": (
                    "(loaded from FX)"
                    if (c, k) in self.originals
                    else ", ".join(self._candidates(c, n, k)[:4])
                    if n.ctor in EMITTED
                    else ""
                ),
            }
            if steered is not None:
                row["steered_cost_us"] = (steered(c, n) if n.ctor in EMITTED else math.inf) * 1e6
            rows.append(row)
        return pd.DataFrame(rows).set_index("node")

    def most_alternatives(self, top: int = 10) -> pd.DataFrame:
        """FX op nodes whose e-class has the most extractable e-nodes."""
        rows = []
        for i, n in enumerate(self.run.translation.gm.graph.nodes):
            c = self.egraph.class_of_id.get(i)
            if c is None or n.op not in ("call_function", "call_method", "call_module"):
                continue
            ctors = [m.ctor for m in self.egraph.classes[c] if m.ctor in EMITTED]
            rows.append(
                {
                    "node": n.name,
                    "eclass": c,
                    "alternatives": len(ctors),
                    "constructors": ", ".join(sorted(set(ctors))),
                    "in_program": c in self.choice,
                }
            )
        frame = pd.DataFrame(rows, columns=["node", "eclass", "alternatives", "constructors", "in_program"])
        return frame.sort_values("alternatives", ascending=False, kind="stable").head(top).set_index("node")

    # ------------------------------------------------------------------ steering
    def _steer(self, change) -> Explorer:
        saved = Steering(dict(self.steering.pins), {c: set(v) for c, v in self.steering.forbids.items()})
        change()
        try:
            return self.reextract(self.steered_extractor)
        except (ExtractionError, ValueError, RuntimeError) as exc:
            self.steering = saved
            raise SteeringError(f"no valid program with this steering ({exc}); steering change undone") from exc

    def pin(self, target: Target, node: int | str) -> Explorer:
        """Force e-node ``node`` (index in :meth:`alternatives`, or "original") for a class; re-extracts."""
        c = self.eclass(target)
        k = self._node_index(c, node, target)
        return self._steer(lambda: self.steering.pin(c, k))

    def forbid(self, target: Target, node: int | str) -> Explorer:
        """Never choose e-node ``node`` of a class; re-extracts."""
        c = self.eclass(target)
        k = self._node_index(c, node, target)
        return self._steer(lambda: self.steering.forbid(c, k))

    def clear_steering(self, target: Target | None = None) -> Explorer:
        """Drop all pins and forbids (or those of one class) and re-extract."""
        c = None if target is None else self.eclass(target)
        self.steering.clear(c)
        return self.reextract(self.steered_extractor)

    def ban_rule(self, *names: str) -> Explorer:
        """Re-saturate from scratch without the named rules (cost: a whole new saturation).

        The rule programs are re-read with those rules cut out; translation,
        loading, saturation, export and the default extraction all run again.
        E-class numbers change, so pins and forbids are cleared. Shape-analysis
        rules cannot be banned.
        """
        unknown = [n for n in names if n not in self.catalogue]
        analysis = [n for n in names if n in self.catalogue and self.catalogue[n].family == "shapes"]
        if unknown:
            raise KeyError(f"unknown rule(s) {unknown}")
        if analysis:
            raise ValueError(f"{analysis} belong to the shape analysis, which other rules rely on")
        self.banned |= set(names)
        self.steering = Steering()
        self._saturate()
        return self

    def unban_rules(self) -> Explorer:
        """Re-saturate with every rule back."""
        self.banned.clear()
        self.steering = Steering()
        self._saturate()
        return self

    # ------------------------------------------------------------------ programs
    def graph(self, which: str = "current") -> fx.GraphModule:
        """ "original", "default" (first extraction), "steered" or "current" as a GraphModule (unverified)."""
        which = self._which(which)
        if which == "original":
            return self.gm
        if which not in self._graphs:
            ext = cast(Extraction, self.default if which == "default" else self.steered)  # _which: steered is set
            gm = rebuild(self.run.translation, self.egraph, ext.choice)
            propagate_meta(gm, self.example_inputs)
            self._graphs[which] = gm
        return self._graphs[which]

    def _which(self, which: str) -> str:
        if which == "current":
            return "steered" if self.steered is not None else "default"
        if which not in ("original", "default", "steered"):
            raise ValueError(f"which: 'original', 'default', 'steered' or 'current', not {which!r}")
        if which == "steered" and self.steered is None:
            raise ValueError("nothing steered yet: pin, forbid or reextract first")
        return which

    def kernels(self, which: str = "current") -> list:
        """Predicted kernel launches (``fx_cost.PredictedKernel``) of a program."""
        which = self._which(which)
        if which not in self._kernels:
            self._kernels[which] = predict_kernels(self.graph(which), self.example_inputs, self.run.objective.profile)
        return self._kernels[which]

    def picture(self, which: str = "current", max_nodes: int = 300, show_params: bool = False) -> Picture:
        """The program as a graph, nodes grouped into predicted kernels."""
        which = self._which(which)
        return fx_picture(self.graph(which), self.kernels(which), which, max_nodes, show_params)

    def side_by_side(self, left: str = "original", right: str = "current", max_nodes: int = 200) -> SideBySide:
        """Two programs as pictures next to each other."""
        return SideBySide(
            [self.picture(left, max_nodes), self.picture(right, max_nodes)], [self._which(left), self._which(right)]
        )

    def code(self, which: str = "current") -> Code:
        """The program's Python code."""
        return Code(self.graph(which).code.strip())

    def code_side_by_side(self, left: str = "original", right: str = "current") -> SideBySide:
        return SideBySide([self.code(left), self.code(right)], [self._which(left), self._which(right)])

    def kernels_table(self, which: str = "current") -> pd.DataFrame:
        """One row per predicted launch: kind, microseconds, note, FX nodes."""
        rows = [
            {
                "kind": getattr(k.kind, "value", str(k.kind)),
                "us": k.seconds * 1e6,
                "note": k.note,
                "nodes": ", ".join(n.name for n in k.nodes),
            }
            for k in self.kernels(which)
        ]
        return pd.DataFrame(rows, columns=["kind", "us", "note", "nodes"]).rename_axis("launch")

    def neighbourhood(
        self,
        target: Target,
        depth: int = 2,
        up: int = 0,
        max_classes: int = 25,
        max_nodes_per_class: int = 8,
        with_costs: bool = True,
    ) -> Picture:
        """Picture of the e-graph around a node or class, bounded by ``max_classes``."""
        return neighbourhood_picture(
            self.egraph,
            self.eclass(target),
            depth=depth,
            up=up,
            max_classes=max_classes,
            max_nodes_per_class=max_nodes_per_class,
            choice=self.choice,
            steering=self.steering,
            names=self.names,
            costs=self.run.cost if with_costs else None,
            parents=self.parents if up else None,
        )

    # ------------------------------------------------------------------ results
    def compare(self) -> pd.DataFrame:
        """Predicted launches and time of the original, the default and the steered program."""
        graph = self.egraph.extraction_graph(self.run.roots, self.run.cost)
        rows = {}
        for which in ("original", "default", "steered"):
            if which == "steered" and self.steered is None:
                continue
            ks = self.kernels(which)
            ext = None if which == "original" else (self.default if which == "default" else self.steered)
            rows[which] = {
                "fx_ops": op_count(self.graph(which)),
                "launches": len(ks),
                "predicted_us": sum(k.seconds for k in ks) * 1e6,
                "extraction_cost_us": dag_cost(graph, ext.choice) * 1e6 if ext else math.nan,
                "extractor": ext.extractor if ext else "",
            }
        frame = pd.DataFrame.from_dict(rows, orient="index")
        frame.index.name = "program"
        return frame

    def export(self, verify: bool = True, rtol: float = 1e-4, atol: float = 1e-5) -> fx.GraphModule:
        """The current program (steered, else default) as a new GraphModule.

        With ``verify`` (default), runs it and the original on the example
        inputs and raises :class:`ExportMismatch` if they differ. Unlike
        ``optimize_graph`` it never falls back to the original.
        """
        which = self._which("current")
        ext = cast(Extraction, self.default if which == "default" else self.steered)  # _which: steered is set
        gm = rebuild(self.run.translation, self.egraph, ext.choice)
        propagate_meta(gm, self.example_inputs)
        if verify:
            if self.example_inputs is None:
                raise ValueError("export(verify=True) needs the example inputs given to Explorer")
            gm.meta["max_abs_diff"] = check_same(self.gm, gm, self.example_inputs, rtol, atol)
        return gm

    def summary(self) -> str:
        r, sat = self.run.report, self.run.saturation
        cmp = self.compare()
        lines = [
            f"saturation: {sat.stop_reason.value} after {sat.iterations} iterations, "
            f"{sat.enodes} e-nodes, {len(self.egraph.classes)} e-classes, {sat.seconds:.2f} s",
            f"rules fired: {len(self.rules_fired())} of {len(self.catalogue)}"
            + (f" (banned: {', '.join(sorted(self.banned))})" if self.banned else ""),
        ]
        for which, row in cmp.iterrows():
            lines.append(
                f"{which:>8}: {row['fx_ops']} FX ops, {row['launches']} predicted launches, "
                f"{row['predicted_us']:.1f} us"
            )
        if self.steering:
            lines.append(
                f"steering: {len(self.steering.pins)} pins, {sum(map(len, self.steering.forbids.values()))} forbids"
            )
        del r
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Explorer {type(self.gm).__name__}: {self.summary()}>"

    def _repr_html_(self) -> str:
        return f"<pre>{esc(self.summary())}</pre>"


class Replacement:
    """What replaced one FX node: its loaded term, the chosen e-node and candidate rules."""

    def __init__(
        self,
        name: str,
        eclass: int,
        original: str,
        chosen_node: str | None,
        chosen: str,
        changed: bool,
        candidate_rules: list[str],
        explorer: Explorer,
    ):
        self.name, self.eclass, self.original = name, eclass, original
        self.chosen_node, self.chosen, self.changed = chosen_node, chosen, changed
        self.candidate_rules = candidate_rules
        self.alternatives = sum(1 for n in explorer.egraph.classes[eclass] if n.ctor in EMITTED)

    def as_dict(self) -> dict:
        return {
            k: getattr(self, k)
            for k in (
                "name",
                "eclass",
                "original",
                "chosen_node",
                "chosen",
                "changed",
                "candidate_rules",
                "alternatives",
            )
        }

    def __repr__(self) -> str:
        verdict = "rewritten" if self.changed else "kept"
        rules = ", ".join(self.candidate_rules[:6]) or "-"
        return (
            f"{self.name} (e-class c{self.eclass}, {self.alternatives} alternatives): {verdict}\n"
            f"  original: {self.original}\n  chosen:   {self.chosen}\n  candidate rules: {rules}"
        )

    def _repr_html_(self) -> str:
        rows: list[list[object]] = [
            ["original", self.original],
            ["chosen", self.chosen],
            ["chosen e-node", self.chosen_node or "-"],
            ["candidate rules (fired, build the chosen constructor)", ", ".join(self.candidate_rules) or "-"],
        ]
        verdict = "rewritten" if self.changed else "kept"
        return (
            f"<b>{esc(self.name)}</b> e-class c{self.eclass}, {self.alternatives} alternatives: {verdict}"
            + html_table(["", ""], rows)
        )
