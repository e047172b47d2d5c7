"""The tree ops trace into one graph under torch.compile (fullgraph): no host sync, no graph
break, same integers as eager. On CPU this covers the PyTorch references (the interpreter's
kernels cannot be traced); on CUDA the Triton kernels, through `triton_op` + `wrap_triton`."""

from __future__ import annotations

import torch

from specdec.ops import build_tree, verify_greedy, verify_speculative, verify_target_only
from specdec.types import TreeMeta
from tree_cases import DEVICE, ON_GPU, make_trees


def test_tree_build_and_verifiers_compile_fullgraph_and_match_eager():
    impl = "triton" if ON_GPU else "ref"
    case = make_trees(3, 7, "random", seed=2).to(DEVICE)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 4, (3, 7), generator=g).to(DEVICE)
    p = torch.rand(3, 7, 9, generator=g)
    p[..., :4] += 0.5
    p = (p / p.sum(-1, keepdim=True)).to(DEVICE)
    q = torch.rand(3, 7, 9, generator=g).softmax(-1).to(DEVICE)
    u = torch.rand(3, 7, 2, generator=g, dtype=torch.float64).to(DEVICE)
    buf = TreeMeta.empty(3, 7, device=DEVICE)

    def step(parents, num_nodes, tokens, p, q, u):
        tree = build_tree(parents, num_nodes, out=buf, impl=impl)
        greedy = verify_greedy(tokens, tree, p, impl=impl)
        target_only = verify_target_only(tokens, tree, p, uniforms=u, impl=impl)
        speculative = verify_speculative(tokens, tree, p, q, uniforms=u, impl=impl)
        return [tree.packed_mask.clone()] + [
            t for acc in (greedy, target_only, speculative) for t in (acc.accept_length, acc.accept_nodes, acc.accept_tokens)
        ]

    eager = step(case.parents, case.num_nodes, tokens, p, q, u)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(case.parents, case.num_nodes, tokens, p, q, u)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
