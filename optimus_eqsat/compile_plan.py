"""How the backend compiles one graph: decided once, before Inductor runs.

:class:`CompilePlan` holds what the backend decided for a graph once the pre-grad pass
has run (which of our Inductor passes run on which graphs, whether the parameter cache
cuts the program, whether the first call times it against the original), and
:meth:`CompilePlan.patches` turns that into the Inductor config patches of the compile,
scoped by ``compile_fx``'s ``config_patches`` to that compile alone.
:class:`PassRecords` collects what those passes record while Inductor runs them, which
is what the measured choice later needs to know (did a pass rewrite the program?).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from optimus_eqsat.report import OptimizeReport

#: The graphs our post-grad pass optimizes when the pre-grad pass changed nothing.
BOTH_ROLES = ("forward", "backward")


@dataclass
class PassRecords:
    """What our Inductor passes recorded in one compile: the post-grad pass's reports, as
    (role, report), and per joint graph how many masks the mask pass recomputes
    (``masks``) and how many of those read a slice of a concatenation (``sliced``)."""

    post_grad: list[tuple[str, OptimizeReport]] = field(default_factory=list)
    masks: list[int] = field(default_factory=list)
    sliced: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class CompilePlan:
    """What one compile of a graph does, from the backend's options and the pre-grad result.

    - ``rewritten``: the pre-grad pass changed the graph, so the program is ours;
    - ``post_grad_roles``: the aten graphs our post-grad pass optimizes (none: it is off).
      The forward's aten graph of a program the pre-grad pass rewrote is that program
      decomposed, where the pass finds nothing more (across the zoo it never kept a rewrite
      there, at up to 1.6 s of compile); the backward, which autograd wrote, is still
      optimized;
    - ``recompute_masks``: the joint graph's bool masks are recomputed in the backward;
    - ``cache_parameters``: the program is cut at its parameter-only work, which then runs
      once (inference, not under Inductor's freezing, which folds that work itself);
    - ``measure``: the first call times the program against the original.
    """

    rewritten: bool
    post_grad_roles: tuple[str, ...] = ()
    recompute_masks: bool = False
    cache_parameters: bool = False
    measure: bool = False

    @classmethod
    def decide(
        cls,
        *,
        rewritten: bool,
        post_grad: bool,
        recompute_masks: bool,
        cache_parameters: bool,
        measure: bool,
    ) -> CompilePlan:
        """The plan for a graph the pre-grad pass ``rewritten`` or not, under the backend's
        switches (``cache_parameters`` already says whether the graph is an inference one)."""
        roles = (("backward",) if rewritten else BOTH_ROLES) if post_grad else ()
        return cls(rewritten, roles, recompute_masks, rewritten and cache_parameters, measure)

    @property
    def compiles_the_original(self) -> bool:
        """Whether no pass of ours touches the graph: it is compiled as Inductor compiles it."""
        return not (self.rewritten or self.post_grad_roles or self.recompute_masks)

    def patches(
        self,
        graph_options: dict[str, Any],
        *sinks: list[tuple[str, OptimizeReport]],
        records: PassRecords | None = None,
    ) -> dict[str, Any]:
        """The Inductor config patches of this compile: our passes, after any the user
        installed, recording into ``records`` (and the post-grad reports into every list
        of ``sinks`` too)."""
        post = [*sinks, records.post_grad] if records is not None else list(sinks)
        return {
            **(post_grad_patches(graph_options, *post, roles=self.post_grad_roles) if self.post_grad_roles else {}),
            **(
                mask_patches(*([records.masks] if records else []), sliced=[records.sliced] if records else [])
                if self.recompute_masks
                else {}
            ),
        }

    def pass_rewrote(self, records: PassRecords, training: bool) -> bool:
        """Whether a pass of ours rewrote the program of a graph the pre-grad pass left alone
        (or may have, where a cache served a graph the pass did not see). Masks count only
        when they read a slice of a concatenation: only those can cost memory."""
        sliced_masks = self.recompute_masks and masks_recomputed(records.sliced, training)
        return sliced_masks or self.post_grad_pass_rewrote(records, training)

    def post_grad_pass_rewrote(self, records: PassRecords, training: bool) -> bool:
        """Whether our post-grad pass rewrote a graph of this compile, or may have."""
        return bool(self.post_grad_roles) and post_grad_rewrote(records.post_grad, training)


def post_grad_patches(
    options: dict[str, Any],
    *reports: list[tuple[str, OptimizeReport]],
    roles: tuple[str, ...] = BOTH_ROLES,
) -> dict[str, Any]:
    """Inductor config patches that add our post-grad pass, on the graphs of ``roles``, after
    any the user installed (``compile_fx`` applies them to its lazily compiled backward too);
    its reports go to every list in ``reports``."""
    from optimus_eqsat.postgrad import PostGradPass

    ours = PostGradPass(roles=roles, **options)
    ours.sinks = list(reports)
    return _after_theirs("post_grad_custom_pre_pass", ours)


def mask_patches(*counts: list[int], sliced: Sequence[list[int]] = ()) -> dict[str, Any]:
    """Inductor config patches that add :class:`~.postgrad.bool_masks.RecomputeMasks` after
    any joint-graph pass the user installed; how many masks each joint graph recomputes goes
    to every list in ``counts``, how many of them read a slice of a concatenation to every
    list in ``sliced``."""
    from optimus_eqsat.postgrad.bool_masks import RecomputeMasks

    ours = RecomputeMasks()
    ours.sinks = list(counts)
    ours.sliced_sinks = list(sliced)
    return _after_theirs("joint_custom_post_pass", ours)


def _after_theirs(option: str, ours: Any) -> dict[str, Any]:
    """The patch of Inductor's custom-pass ``option`` that runs ``ours`` after the user's."""
    from torch._inductor import config

    theirs = getattr(config, option)
    passes = (*theirs, ours) if isinstance(theirs, (list, tuple)) else (theirs, ours) if theirs else ours
    return {option: passes}


def post_grad_rewrote(reports: list[tuple[str, OptimizeReport]], training: bool) -> bool:
    """Whether the post-grad pass spliced a program into a graph of this compile, or may have:
    a graph it did not see (Inductor's FX graph cache served it, with what the pass wrote
    when it was compiled) counts as rewritten."""
    expected = set(BOTH_ROLES) if training else {"forward"}
    if not expected <= {role for role, _ in reports}:
        return True
    return any(not r.fell_back and r.changed for _, r in reports)


def masks_recomputed(counts: list[int], training: bool) -> bool:
    """Whether the joint-graph pass marked masks (of the kind ``counts`` counts) in this
    compile, or may have: in training a joint graph it did not see (a cache served the
    program) counts as marked."""
    return training and (not counts or any(counts))
