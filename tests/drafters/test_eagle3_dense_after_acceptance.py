"""EAGLE-3 drafts after any sequence of partial acceptances equal a dense recomputation.

test_eagle3_drafter.py checks this against the dense oracle for one fixed acceptance, and
for random acceptances against a fresh drafter (the same code). Here random prompts and
several rounds of random acceptance lengths per slot (0 .. depth, every slot its own) are
checked against `dense_path_logits`: plain causal SDPA over the whole committed history
(no paging, no tree masks, no draft-KV correction), then one row per path token. A drafter
that reads one position too far, keeps a stale draft-KV row after a partial acceptance, or
lets a node see its siblings drafts other tokens: output stays exact, acceptance falls, and
only a test like this notices. (The MTP head has the same test in test_mtp_drafter.py.)
"""

from __future__ import annotations

import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from _eagle3_heads import World
from test_eagle3_drafter import CASES, WIDTH, Slots, dense_path_logits, make


def _paths(parents: list[int], tokens: list[int], n: int) -> dict[int, list[int]]:
    """Node -> its draft tokens after the root (target ids), for nodes 0 .. n-1."""
    out = {0: []}
    for i in range(1, n):
        out[i] = out[parents[i]] + [tokens[i]]
    return out


@settings(max_examples=10)
@given(case=st.sampled_from(CASES), data=st.data())
def test_drafts_after_random_partial_acceptances_equal_the_dense_oracle(case, data):
    tree, topk, depth = case
    B = 2
    d, cfg = make(tree, topk, depth, B=B)
    worlds = [World(70, WIDTH, seed=data.draw(st.integers(0, 999)), dtype=torch.float64) for _ in range(B)]
    s = Slots(d, cfg, worlds)
    for slot in range(B):
        s.prefill(slot, data.draw(st.integers(1, 12), label=f"prompt length of slot {slot}"))
    t = d.propose(s.inputs())
    for _ in range(data.draw(st.integers(1, 4), label="rounds")):
        accepted = [data.draw(st.integers(0, depth)) for _ in range(B)]
        note(f"accepted={accepted} committed={s.committed}")
        for slot in range(B):
            s.accept_path(slot, accepted[slot])
        t = d.propose(s.inputs())
    K = topk or 1
    for slot in range(B):
        C = s.committed[slot]
        next_tokens, hidden = worlds[slot].prefill_args(C)
        root = dense_path_logits(d.model, d.embed, next_tokens, hidden, [])
        assert torch.allclose(d.root_logits[slot], root, atol=1e-9), slot
        n = int(t.num_nodes[slot])
        parents, tokens = t.parents[slot].tolist(), t.tokens[slot].tolist()
        assert tokens[0] == int(worlds[slot].seq[C])  # the root is the last committed token
        paths = _paths(parents, tokens, n)
        for i in range(n):
            children = [tokens[j] for j in range(1, n) if parents[j] == i]
            if not children:
                continue
            ref = dense_path_logits(d.model, d.embed, next_tokens, hidden, paths[i])
            best = d.model.draft_to_target(ref.topk(K).indices).tolist()
            assert set(children) <= set(best), (slot, i, paths[i], children, best)
