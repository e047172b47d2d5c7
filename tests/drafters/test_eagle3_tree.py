"""Draft-tree growth: EAGLE-2 expansion equals a plain-Python reference; sampled trees keep whole groups.

The draft model is replaced by a table oracle: the draft log-distribution at a node is a fixed
random row chosen by a hash of the node's path, so the tensor code and the reference see the
same distributions without any model.
"""

import numpy as np
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.drafters.dynamic_tree import eagle2_tree, group_sizes, history_size, sampled_tree, stable_topk
from specdec.testing.kit import references_on_cpu
from specdec.testing.oracles import PathTable, naive_dynamic

ROWS = 61
P = PathTable.P


def _hash(h, tok):
    return (h * 31 + tok + 1) % P  # `PathTable.child`


class Oracle(PathTable):
    """The kit's path table (logq(path) = table[hash(path) % ROWS]) with the callbacks the
    `eagle2_tree` / `sampled_tree` adapters take: the roots' rows and a tensor `step`."""

    def __init__(self, vocab: int, seed: int, integer: bool = False, scale: float = 3.0):
        super().__init__(vocab, seed, rows=ROWS, scale=scale, integer=integer)

    def root(self, B):
        return self.table[torch.arange(B) % ROWS]  # root of row b has hash b

    def tensor_step(self, B):
        """A `step` callback tracking path hashes of the frontier rows."""
        state = {"h": torch.arange(B)[:, None]}  # [B, F_prev]

        def step(tokens, parent_slot):
            h = _hash(torch.gather(state["h"], 1, parent_slot), tokens)
            state["h"] = h
            return self.table[h % ROWS]  # [B, F, V]

        return step


def naive_eagle2(oracle: Oracle, b: int, K: int, D: int, budget: int):
    """EAGLE-2 on Python lists for batch row b (the kit's brute force): (tokens, parents) of nodes 1..budget."""
    tokens, parents, _ = naive_dynamic(oracle, b, K, D, budget)
    return tokens, parents


@st.composite
def shapes(draw):
    K = draw(st.integers(1, 4))
    D = draw(st.integers(1, 4))
    V = draw(st.integers(K, 24))
    budget = draw(st.integers(1, history_size(K, D)))
    return dict(B=draw(st.integers(1, 3)), K=K, D=D, V=V, budget=budget, seed=draw(st.integers(0, 2**16)))


@given(shapes())
def test_eagle2_tree_equals_the_plain_python_reference(s):
    note(str(s))
    oracle = Oracle(s["V"], s["seed"])
    B = s["B"]
    grown = eagle2_tree(oracle.root(B), oracle.tensor_step(B), topk=s["K"], depth=s["D"], budget=s["budget"])
    for b in range(B):
        tokens, parents = naive_eagle2(oracle, b, s["K"], s["D"], s["budget"])
        assert grown.tokens[b].tolist() == tokens
        assert grown.parents[b].tolist() == parents


def assert_valid_tree(parents: torch.Tensor, depth: int):
    """parents [B, S] (tree indices of nodes 1..S): topological, depth <= D, distinct-free check elsewhere."""
    B, S = parents.shape
    for b in range(B):
        par = [-1] + parents[b].tolist()
        for i in range(1, S + 1):
            assert 0 <= par[i] < i, (b, i, par)
            d, j = 0, i
            while j > 0:
                j, d = par[j], d + 1
            assert d <= depth


@given(shapes())
def test_eagle2_trees_stay_valid_under_exact_ties(s):
    note(str(s))
    oracle = Oracle(s["V"], s["seed"], integer=True)
    B = s["B"]
    grown = eagle2_tree(oracle.root(B), oracle.tensor_step(B), topk=s["K"], depth=s["D"], budget=s["budget"])
    assert_valid_tree(grown.parents, s["D"])
    for b in range(B):  # siblings are distinct tokens
        pairs = list(zip(grown.parents[b].tolist(), grown.tokens[b].tolist()))
        assert len(set(pairs)) == len(pairs)


def test_stable_topk_breaks_ties_by_lower_index_and_ranks_nan_last():
    x = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 2.0, 3.0]])
    assert stable_topk(x, 4).tolist() == [[1, 2, 5, 4]]
    assert stable_topk(x, 6).tolist()[0][-1] == 3


@given(
    depth=st.integers(1, 5), topk=st.integers(1, 4), B=st.integers(1, 3), V=st.integers(2, 16),
    seed=st.integers(0, 2**16), data=st.data(),
)
def test_sampled_trees_keep_whole_iid_groups_and_expand_the_best_draw(depth, topk, B, V, seed, data):
    budget = data.draw(st.integers(depth, depth * topk))
    sizes = group_sizes(budget, depth, topk)
    assert sum(sizes) == budget and all(1 <= c <= topk for c in sizes) and list(sizes) == sorted(sizes, reverse=True)
    oracle = Oracle(V, seed)
    gen = torch.Generator().manual_seed(seed)
    grown = sampled_tree(
        oracle.root(B), oracle.tensor_step(B), sizes=sizes,
        sample=lambda p, c: torch.multinomial(p, c, replacement=True, generator=gen),
    )
    assert grown.tokens.shape == (B, budget) and grown.dists.shape == (B, depth, V)
    assert_valid_tree(grown.parents, depth)
    for b in range(B):
        toks, par, didx = grown.tokens[b].tolist(), grown.parents[b].tolist(), grown.dist_index[b].tolist()
        h, score, parent, first = b, 0.0, 0, 1  # walk the groups: the expanded node is the best draw
        for t, c in enumerate(sizes):
            group = range(first - 1, first - 1 + c)
            assert all(par[i] == parent for i in group)  # one whole group per depth
            lq = oracle.row(h)
            assert torch.allclose(grown.dists[b, t], torch.from_numpy(lq).exp())
            scores = [np.float32(score + lq[toks[i]]) for i in group]
            expanded = [i for i in group if didx[i] >= 0]
            if t + 1 < len(sizes):
                best = min(range(c), key=lambda j: (-scores[j], j))
                assert expanded == [first - 1 + best] and didx[first - 1 + best] == t + 1
                h, score, parent = _hash(h, toks[first - 1 + best]), scores[best], first + best
            else:
                assert expanded == []
            first += c


def test_sampled_trees_with_speculative_verification_emit_the_target_distribution():
    """Many i.i.d. trials as batch rows: a sampled tree (groups of 3 then 2 draws) verified by
    `verify_speculative` emits a first token ~ p(root) and, after an accepted first draft, a
    second token ~ p(. | first). A tree pruned by the draws' own values would fail this."""
    from specdec.ops import build_tree, verify_speculative

    B, V = 40_000, 5
    draft = Oracle(V, seed=1, scale=1.0)
    target = Oracle(V, seed=2, scale=1.0)
    gen = torch.Generator().manual_seed(0)
    step = draft.tensor_step(B)
    root_h = torch.zeros(B, 1, dtype=torch.int64)
    step_state = {"first": True}

    def same_root_step(tokens, parent_slot):  # every row starts from the same root (hash 0)
        if step_state.pop("first", False):
            return draft.table[_hash(root_h, tokens) % ROWS]
        return step(tokens, parent_slot)

    root_logq = draft.table[torch.zeros(B, dtype=torch.int64)]
    with references_on_cpu("cpu"):  # 40k rows: the ranking's PyTorch body (test_ranked_call compares the kernel)
        grown = sampled_tree(
            root_logq, same_root_step, sizes=(3, 2),
            sample=lambda p, c: torch.multinomial(p, c, replacement=True, generator=gen),
        )
    S = grown.tokens.shape[1]
    parents = torch.cat([torch.full((B, 1), -1), grown.parents], 1)  # [B, N]
    tokens = torch.cat([torch.zeros(B, 1, dtype=torch.int64), grown.tokens], 1)
    hashes = torch.zeros(B, S + 1, dtype=torch.int64)  # path hash of every node
    for i in range(1, S + 1):
        hashes[:, i] = _hash(hashes.gather(1, parents[:, i : i + 1])[:, 0], tokens[:, i])
    target_probs = target.table[hashes % ROWS].exp()  # [B, N, V]
    index = torch.cat([torch.zeros(B, 1, dtype=torch.int64), grown.dist_index], 1)
    draft_probs = grown.dists.gather(1, index.clamp(min=0)[..., None].expand(-1, -1, V))
    draft_probs = torch.where((index >= 0)[..., None], draft_probs, 0.0)
    tree = build_tree(parents, torch.full((B,), S + 1), impl="ref")
    acc = verify_speculative(tokens, tree, target_probs, draft_probs, generator=gen, impl="ref")

    def assert_matches(samples, p, what):
        n = samples.numel()
        freq = torch.bincount(samples, minlength=V).double() / n
        bound = 5 * (p * (1 - p) / n).sqrt() + 1e-4
        assert bool(((freq - p).abs() <= bound).all()), (what, n, freq.tolist(), p.tolist())

    first = acc.accept_tokens[:, 0]
    assert_matches(first, target.table[0].exp().double(), "first token")
    went_on = acc.accept_length >= 1
    assert 0.2 < float(went_on.double().mean()) < 0.95  # both branches are exercised
    for x in range(V):
        rows = went_on & (first == x)
        if int(rows.sum()) > 2000:
            assert_matches(acc.accept_tokens[rows, 1], target.table[_hash(0, x) % ROWS].exp().double(), f"after {x}")
