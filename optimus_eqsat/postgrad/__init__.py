"""The optimizer on Inductor's post-grad aten graphs, forward and backward.

- :mod:`.graph_pass`: :class:`PostGradPass`, the ``CustomGraphPass`` the backend
  installs as ``post_grad_custom_pre_pass`` around its compile;
- :mod:`.lowering`: the rebuilt program retraced into functional aten and spliced
  into Inductor's graph in place;
- :mod:`.capture`: AOTAutograd's aten graphs of a function, run eagerly through a
  pass (tests, the fuzzer, studies).
"""

from optimus_eqsat.postgrad.graph_pass import PostGradPass, graph_role, optimize_aten_graph

__all__ = ["PostGradPass", "graph_role", "optimize_aten_graph"]
