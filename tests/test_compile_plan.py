"""The backend's compile plan: which of our Inductor passes run, decided once per graph."""

from __future__ import annotations

from optimus_eqsat.compile_plan import CompilePlan, PassRecords
from optimus_eqsat.report import OptimizeReport


def _plan(rewritten: bool, **switches) -> CompilePlan:
    return CompilePlan.decide(
        rewritten=rewritten,
        post_grad=switches.get("post_grad", True),
        recompute_masks=switches.get("recompute_masks", True),
        cache_parameters=switches.get("cache_parameters", True),
        measure=switches.get("measure", True),
    )


def test_a_rewritten_graph_runs_the_post_grad_pass_on_its_backward_only():
    assert _plan(True).post_grad_roles == ("backward",)
    assert _plan(False).post_grad_roles == ("forward", "backward")
    assert _plan(True, post_grad=False).post_grad_roles == ()


def test_only_a_rewritten_graph_is_cut_at_its_parameter_work():
    assert _plan(True).cache_parameters
    assert not _plan(False).cache_parameters
    assert not _plan(True, cache_parameters=False).cache_parameters


def test_with_every_pass_off_the_original_is_compiled_as_inductor_compiles_it():
    assert _plan(False, post_grad=False, recompute_masks=False).compiles_the_original
    assert not _plan(False, post_grad=False).compiles_the_original
    assert not _plan(True, post_grad=False, recompute_masks=False).compiles_the_original


def test_patches_name_our_passes_and_leave_inductors_own_settings_alone():
    sink: list = []
    records = PassRecords()
    patches = _plan(False).patches({}, sink, records=records)
    assert set(patches) == {"post_grad_custom_pre_pass", "joint_custom_post_pass"}  # ours alone
    post = patches["post_grad_custom_pre_pass"]
    post = post[-1] if isinstance(post, tuple) else post
    assert post.sinks == [sink, records.post_grad]  # every report reaches both lists
    masks = patches["joint_custom_post_pass"]
    masks = masks[-1] if isinstance(masks, tuple) else masks
    assert masks.sinks == [records.masks] and masks.sliced_sinks == [records.sliced]
    rewritten = _plan(True, recompute_masks=False).patches({})
    assert set(rewritten) == {"post_grad_custom_pre_pass"}  # (in-place buffers as the user set them)


def test_a_pass_rewrote_the_program_when_a_report_changed_or_sliced_masks_were_recomputed():
    plan = _plan(False)
    kept = OptimizeReport(fell_back=True)
    seen_both = PassRecords(post_grad=[("forward", kept), ("backward", kept)], masks=[2], sliced=[0])
    assert not plan.pass_rewrote(seen_both, training=True)  # masks that read no slice of a cat
    assert plan.pass_rewrote(PassRecords(post_grad=seen_both.post_grad, sliced=[1]), training=True)
    assert not _plan(False, post_grad=False).pass_rewrote(PassRecords(sliced=[0]), training=True)
    assert plan.pass_rewrote(PassRecords(), training=False)  # the forward unseen: a cache served it
