"""The MTP drafter: incremental drafting (prefill, ingest, recursive tree steps over the paged
draft KV) equals a from-scratch dense recomputation, valid trees, slot lifecycle, sampled drafts.

The target is replaced by a world (a token sequence and random last hidden states per
position): the drafter only sees tokens and the target's last hidden state. Heads run in
float64 where two computations are compared.
"""

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from specdec.config import ConfigError, SpecConfig
from specdec.drafters.dynamic_tree import logq_expander
from specdec.drafters.mtp_drafter import MTPDrafter, restricted_head
from specdec.drafters.mtp_model import causal_attend
from specdec.policies import top_candidates
from specdec.step_state import StepState

from _mtp_heads import D, V, random_mtp

CASES = [("linear", None, 4), ("dynamic", 3, 3), ("dynamic", 2, 4)]


class World:
    """seq[p]: the token at position p; H[p]: the target's last hidden state at p."""

    def __init__(self, length, seed):
        g = torch.Generator().manual_seed(seed)
        self.seq = torch.randint(0, V, (length,), generator=g)
        self.H = torch.randn(length, D, generator=g, dtype=torch.float64)


def make(tree="linear", topk=None, depth=4, B=3, samples=False, dtype=torch.float64, target_ids=None, **kw):
    model = random_mtp(seed=1, dtype=dtype, std=0.3, **kw)
    cfg = SpecConfig(drafter="mtp", tree=tree, topk=topk, max_draft_len=depth, max_batch_size=B, max_seq_len=80,
                     kv_block_size=4)
    g = torch.Generator().manual_seed(99)
    embed = torch.nn.Embedding(V, D).to(dtype)
    head = torch.nn.Linear(D, V, bias=False).to(dtype)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(V, D, generator=g))
        head.weight.copy_(torch.randn(V, D, generator=g) * 0.3)
    if target_ids is not None:
        head = restricted_head(head.weight, target_ids)
    elif model.lm_head is not None:
        head = None
    d = MTPDrafter(model, cfg, embed=embed, head=head, target_ids=target_ids, samples_drafts=samples)
    d.cache.storage.normal_(0, 30.0, generator=g)  # loud garbage in never-written draft KV: reading it shows
    return d, cfg


class Slots:
    """What the engine passes the drafter, slot by slot."""

    def __init__(self, drafter, cfg, worlds):
        self.d, self.cfg, self.worlds = drafter, cfg, worlds
        B, N = cfg.cache.max_batch_size, cfg.shape.num_tree_slots
        self.committed, self.accept, self.active = [0] * B, [-1] * B, [False] * B
        self.hidden = None
        self.accept_tokens = torch.full((B, N), -1)

    def prefill(self, slot, L):
        w = self.worlds[slot]
        self.d.prefill(slot, w.seq[1 : L + 1].clone(), w.H[:L].clone())
        self.committed[slot], self.accept[slot], self.active[slot] = L, -1, True

    def accept_path(self, slot, a):
        """a drafts + the bonus accepted: tokens seq[C+1..C+a+1], target states H[C..C+a]."""
        w, C = self.worlds[slot], self.committed[slot]
        B, N = self.cfg.cache.max_batch_size, self.cfg.shape.num_tree_slots
        if self.hidden is None:
            self.hidden = torch.full((B, N, D), float("nan"), dtype=torch.float64)
        self.hidden[slot] = float("nan")  # rows past a are undefined
        self.hidden[slot, : a + 1] = w.H[C : C + a + 1]
        self.accept_tokens[slot] = -1
        self.accept_tokens[slot, : a + 1] = w.seq[C + 1 : C + a + 2]
        self.committed[slot], self.accept[slot] = C + a + 1, a

    def inputs(self):
        root = torch.tensor([int(w.seq[c]) for w, c in zip(self.worlds, self.committed)])
        return StepState.for_drafting(
            root_tokens=root, committed_len=torch.tensor(self.committed), accept_length=torch.tensor(self.accept),
            accept_tokens=self.accept_tokens.clone(), hidden_path=None if self.hidden is None else self.hidden.clone(),
            active=torch.tensor(self.active), drafter=self.d,
        )


def dense_logits(d: MTPDrafter, world: World, C: int, path: list[int]) -> torch.Tensor:
    """Reference: the head's logits [V] at the end of `path` (draft tokens after the root), recomputed
    from scratch: rows (H[p], seq[p+1]) for p < C, then one recursive row per path token, all
    with plain causal attention (a chain: its ancestors are exactly the earlier rows)."""
    m = d.model
    embeds = d.embed(world.seq[1 : C + 1][None])  # [1, C, d]
    hidden = world.H[:C][None]
    positions = torch.arange(C)[None]
    with torch.no_grad():
        fb, logits = m(embeds, hidden, positions, causal_attend(d.scale), head=d.head)
        for i, tok in enumerate(path):
            embeds = torch.cat([embeds, d.embed(torch.tensor([[tok]]))], 1)
            hidden = torch.cat([hidden, fb[:, -1:]], 1)
            positions = torch.cat([positions, torch.tensor([[C + i]])], 1)
            fb, logits = m(embeds, hidden, positions, causal_attend(d.scale), head=d.head)
    return logits[0, -1]


def reference_tree(d: MTPDrafter, world: World, C: int):
    """The tree the drafter's own policy grows when every node's distribution is `dense_logits`."""
    paths = [[]]  # paths of the previous call's rows

    def step(tokens, parent_slot):
        nonlocal paths
        new = [paths[int(p)] + [int(t)] for t, p in zip(tokens[0], parent_slot[0])]
        paths = new
        return torch.stack([torch.log_softmax(dense_logits(d, world, C, p), -1) for p in new])[None]

    root = torch.log_softmax(dense_logits(d, world, C, []), -1)[None]
    grown = d.policy.grow(logq_expander(root, step, top_candidates), 1, root.device)
    return [int(world.seq[C])] + grown.tokens[0].tolist(), [-1] + grown.parents[0].tolist()


def assert_valid(tree, cfg, live):
    B, N = tree.tokens.shape
    assert N == cfg.shape.num_tree_slots
    for b in range(B):
        n = int(tree.num_nodes[b])
        assert n == (N if live[b] else 1)
        par = tree.parents[b].tolist()
        assert par[0] == -1 and all(0 <= par[i] < i for i in range(1, n)) and all(p == -1 for p in par[n:])
        depth = [0] * n
        for i in range(1, n):
            depth[i] = depth[par[i]] + 1
        assert max(depth) <= cfg.shape.max_draft_len


@settings(max_examples=5)
@given(case=st.sampled_from(CASES), data=st.data())
def test_drafts_after_prefill_and_partial_acceptance_equal_a_dense_recomputation(case, data):
    tree, topk, depth = case
    B = 3
    d, cfg = make(tree, topk, depth, B=B)
    worlds = [World(70, seed=data.draw(st.integers(0, 999))) for _ in range(B)]
    s = Slots(d, cfg, worlds)
    for slot in range(B):
        s.prefill(slot, data.draw(st.integers(1, 12)))
    t = d.propose(s.inputs())
    for _ in range(data.draw(st.integers(1, 3))):
        accepted = [data.draw(st.integers(0, depth)) for _ in range(B)]
        note(f"accepted={accepted} committed={s.committed}")
        for slot in range(B):
            s.accept_path(slot, accepted[slot])
        t = d.propose(s.inputs())
    assert_valid(t, cfg, [True] * B)
    for slot in range(B):
        toks, par = reference_tree(d, worlds[slot], s.committed[slot])
        assert t.tokens[slot].tolist() == toks and t.parents[slot].tolist() == par, slot
        ref_root = dense_logits(d, worlds[slot], s.committed[slot], [])
        assert torch.allclose(d.root_logits[slot], ref_root, atol=1e-9)


def test_a_head_with_its_own_lm_head_and_normed_feedback_drafts_like_the_reference():
    d, cfg = make("dynamic", 2, 3, B=1, has_lm_head=True, feed_normed=True, concat_order="hidden_first", qkv_bias=True)
    assert d.head is None
    world = World(40, seed=4)
    s = Slots(d, cfg, [world])
    s.prefill(0, 9)
    d.propose(s.inputs())
    s.accept_path(0, 2)
    t = d.propose(s.inputs())
    toks, par = reference_tree(d, world, s.committed[0])
    assert t.tokens[0].tolist() == toks and t.parents[0].tolist() == par


def test_idle_and_reset_slots_draft_root_only_trees_and_a_reused_slot_starts_clean():
    d, cfg = make("dynamic", 2, 3)
    world, other = World(40, seed=5), World(40, seed=6)
    s = Slots(d, cfg, [other, world, world])
    s.prefill(0, 20)
    s.prefill(2, 6)
    t = d.propose(s.inputs())
    assert_valid(t, cfg, [True, False, True])  # slot 1 was never prefilled
    s.accept_path(0, 3)
    d.propose(s.inputs())
    d.reset_slot(0)
    t = d.propose(s.inputs())  # the engine still says active, but the slot has no draft state
    assert int(t.num_nodes[0]) == 1 and t.parents[0].tolist() == [-1] * cfg.shape.num_tree_slots
    s.worlds[0] = world
    s.prefill(0, 7)  # reused by a new request
    again = d.propose(s.inputs())
    toks, par = reference_tree(d, world, 7)
    assert again.tokens[0].tolist() == toks and again.parents[0].tolist() == par


@pytest.mark.parametrize("tree, topk, depth", [("linear", None, 3), ("dynamic", 2, 3)])
def test_sampled_drafts_carry_the_distribution_each_node_was_drawn_from(tree, topk, depth):
    d, cfg = make(tree, topk, depth, B=2, samples=True, dtype=torch.float32)
    s = Slots(d, cfg, [World(30, seed=2), World(30, seed=3)])
    s.prefill(0, 8)
    t = d.propose(s.inputs())
    assert_valid(t, cfg, [True, False])
    N = cfg.shape.num_tree_slots
    probs = t.draft_probs  # [B, N, V]
    assert probs.shape == (2, N, V) and probs.dtype == torch.float32
    par = t.parents[0].tolist()
    has_children = torch.zeros(N, dtype=torch.bool)
    has_children[[p for p in par[1:] if p >= 0]] = True
    assert torch.allclose(probs[0].sum(-1), has_children.float(), atol=1e-5)
    assert torch.allclose(probs[0, 0], torch.softmax(d.root_logits[0], -1).float(), atol=1e-6)
    for i in range(1, N):  # every drawn token had positive probability under its parent's row
        assert float(probs[0, par[i], t.tokens[0, i]]) > 0
    assert float(probs[1].abs().max()) == 0.0  # the idle slot proposes nothing


def test_prefill_and_propose_reject_inputs_of_the_wrong_shape():
    d, cfg = make()
    with pytest.raises(ValueError, match="needs the target's last hidden state"):
        d.prefill(0, torch.zeros(4, dtype=torch.int64), None)
    with pytest.raises(ValueError, match=r"hidden has shape \(3, 64\); expected \[4, 64\]"):
        d.prefill(0, torch.zeros(4, dtype=torch.int64), torch.zeros(3, D))
    with pytest.raises(ValueError, match="slot=3 is out of range"):
        d.reset_slot(3)
    s = Slots(d, cfg, [World(20, seed=0)] * 3)
    s.prefill(0, 5)
    inp = s.inputs()
    inp.hidden_path = torch.zeros(3, cfg.shape.num_tree_slots, 3 * D)
    with pytest.raises(ValueError, match=r"StepState.hidden_path has width 192; the MTP head reads .* width 64"):
        d.propose(inp)
    assert d.reads == "last_hidden" and not d.runs_on_host


def _run(d, cfg, worlds, accepted):
    s = Slots(d, cfg, worlds)
    for slot, L in enumerate((5, 9, 3)):
        s.prefill(slot, L)
    t = d.propose(s.inputs())
    for a in accepted:
        for slot in range(cfg.cache.max_batch_size):
            s.accept_path(slot, a)
        t = d.propose(s.inputs())
    return t


@pytest.mark.parametrize("tree, topk, depth", CASES)
def test_a_draft_vocabulary_of_every_id_drafts_exactly_like_the_full_head(tree, topk, depth):
    """target_ids = all V ids through restricted_head: the same trees as the full-vocabulary head."""
    worlds = [World(70, seed=s) for s in range(3)]
    full, cfg = make(tree, topk, depth)
    every, _ = make(tree, topk, depth, target_ids=torch.arange(V))
    a, b = _run(full, cfg, worlds, [1, 2]), _run(every, cfg, worlds, [1, 2])
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)


@pytest.mark.parametrize("samples", [False, True], ids=["top-k", "sampled"])
def test_a_draft_vocabulary_keeps_drafts_and_draft_probs_inside_it(samples):
    ids = torch.arange(1, V, 3)  # a third of the vocabulary, not starting at 0
    d, cfg = make("dynamic", 3, 3, samples=samples, target_ids=ids)
    t = _run(d, cfg, [World(70, seed=s) for s in range(3)], [0, 3])
    allowed = set(ids.tolist())
    assert set(t.tokens[:, 1:].flatten().tolist()) <= allowed  # slot 0 is the committed root
    if samples:
        outside = torch.ones(V, dtype=torch.bool)
        outside[ids] = False
        assert float(t.draft_probs[..., outside].abs().max()) == 0.0
        rows = t.draft_probs.sum(-1)  # [B, N]: a node whose children were drafted holds their distribution
        assert bool(((rows - 1).abs() < 1e-6).logical_or(rows == 0).all()) and bool((rows[:, 0] > 0.5).all())
    own, cfg = make(has_lm_head=True)
    with pytest.raises(ConfigError, match=r"share the target's lm_head; this one has its own lm_head"):
        MTPDrafter(own.model, cfg, embed=own.embed, head=restricted_head(own.model.lm_head.weight, ids), target_ids=ids)
