"""Batching's independent groups (rewrites/batching/candidates.py): the one-pass layering
gives the groups of the greedy rule it replaced, and stays fast on long chains."""

from __future__ import annotations

import operator
import random
import time
from collections import defaultdict

import torch
import torch.fx

from benchmarks.synthetic import GENERATORS
from optimus_eqsat.rewrites.batching import KINDS, MIN_GROUP, parse_candidate
from optimus_eqsat.rewrites.batching.candidates import independent_groups
from optimus_eqsat.translate import translate


def _keyed(t):
    keyed = defaultdict(list)
    for i, term in t.terms.items():
        c = parse_candidate(i, term)
        if c is not None:
            for kind in KINDS:
                key = kind.key(t, c)
                if key is not None:
                    keyed[(kind.name, key)].append(c)
    return {k: v for k, v in keyed.items() if len(v) >= MIN_GROUP}


def _greedy(t, members):
    """The rule, literally: in graph order, join the first group holding no ancestor."""
    ancestors: list[set[int]] = []
    for i, node in enumerate(t.gm.graph.nodes):
        ancestors.append(set().union(*({t.index[a]} | ancestors[t.index[a]] for a in node.all_input_nodes)))
    groups: list[list] = []
    for c in sorted(members, key=lambda c: c.node):
        for group in groups:
            if not any(m.node in ancestors[c.node] for m in group):
                group.append(c)
                break
        else:
            groups.append([c])
    return groups


def _random_graph(seed: int, n: int = 120):
    rng = random.Random(seed)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 4, device="meta")
    values = [x]
    for _ in range(n):
        a, b = rng.choice(values[-8:]), rng.choice(values)
        op = rng.choice([torch.relu, torch.tanh, operator.add, operator.mul])
        node = graph.call_function(op, (a,) if op in (torch.relu, torch.tanh) else (a, b))
        node.meta["val"] = torch.empty(2, 4, device="meta")
        values.append(node)
    graph.output(tuple(values[-3:]))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_layers_are_the_greedy_groups():
    for seed in range(20):
        t = translate(_random_graph(seed), None)
        keyed = _keyed(t)
        found = independent_groups(t, keyed)
        assert found == {key: _greedy(t, members) for key, members in keyed.items()}, seed


def test_chains_group_in_linear_time():
    gm, _ = GENERATORS["unary_runs"](20_000)
    t = translate(gm, None)
    start = time.perf_counter()
    groups = independent_groups(t, _keyed(t))
    assert time.perf_counter() - start < 5.0  # pairwise tests: 83 s for the batch phase at 30,000 nodes
    assert all(len(g) == 1 for key_groups in groups.values() for g in key_groups)  # a chain: nothing independent
