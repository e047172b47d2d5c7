"""The EAGLE-3 drafter: valid trees, draft-KV correction, slot lifecycle, explicit first step.

The target is replaced by a `World` (a token sequence and random captured states per
position): the drafter only sees tokens and captured states, so any consistent history will
do. Heads run in float64 where exact equality between two computations is asserted.
"""

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from specdec.config import SamplingParams, SpecConfig
from specdec.drafters.eagle3_drafter import Eagle3Drafter
from specdec.drafters.eagle3_model import Eagle3ShapeError
from specdec.step_state import StepState
from specdec.testing.kit import references_on_cpu
from specdec.types import SamplingTensors

from _attend import growing_sdpa
from _eagle3_heads import D_T, V, World, random_head

WIDTH = 3 * D_T


def make(tree="linear", topk=None, depth=4, B=3, samples=False, dtype=torch.float64, seed=0, num_layers=1, **kw):
    head = random_head(seed=seed, dtype=dtype, num_layers=num_layers)
    cfg = SpecConfig(
        drafter="eagle3", tree=tree, topk=topk, max_draft_len=depth, max_batch_size=B, max_seq_len=80,
        kv_block_size=4, **kw,
    )
    embed = torch.nn.Embedding(V, D_T).to(dtype)
    torch.nn.init.normal_(embed.weight, generator=torch.Generator().manual_seed(99))
    return Eagle3Drafter(head, cfg, embed=embed, samples_drafts=samples), cfg


class Slots:
    """Host-side mirror of what the engine passes: per slot a World, committed length and last acceptance."""

    def __init__(self, drafter, cfg, worlds):
        self.d, self.cfg, self.worlds = drafter, cfg, worlds
        B, N = cfg.cache.max_batch_size, cfg.shape.num_tree_slots
        self.committed = [0] * B
        self.accept = [-1] * B
        self.active = [False] * B
        self.hidden = None
        self.accept_tokens = torch.full((B, N), -1)

    def prefill(self, slot, L):
        self.d.prefill(slot, *self.worlds[slot].prefill_args(L))
        self.committed[slot], self.accept[slot], self.active[slot] = L, -1, True

    def accept_path(self, slot, a):
        """The last tree's a drafts + bonus were accepted: tokens seq[C+1..C+a+1], states H[C..C+a]."""
        w, C = self.worlds[slot], self.committed[slot]
        B, N = self.cfg.cache.max_batch_size, self.cfg.shape.num_tree_slots
        if self.hidden is None:
            self.hidden = torch.full((B, N, WIDTH), float("nan"), dtype=w.H.dtype)
        self.hidden[slot] = float("nan")  # rows past a are undefined
        self.hidden[slot, : a + 1] = w.H[C : C + a + 1]
        self.accept_tokens[slot] = -1
        self.accept_tokens[slot, : a + 1] = w.seq[C + 1 : C + a + 2]
        self.committed[slot], self.accept[slot] = C + a + 1, a

    def inputs(self, sampling=None):
        B = self.cfg.cache.max_batch_size
        root = torch.tensor([int(self.worlds[s].seq[self.committed[s]]) for s in range(B)])
        inp = StepState.for_drafting(
            root_tokens=root, committed_len=torch.tensor(self.committed), accept_length=torch.tensor(self.accept),
            accept_tokens=self.accept_tokens.clone(), hidden_path=None if self.hidden is None else self.hidden.clone(),
            active=torch.tensor(self.active), drafter=self.d,
        )
        if sampling is not None:
            inp.sampling = sampling
        return inp


def fresh_tree(tree, topk, depth, world, L, slot=0, **kw):
    """The tree a brand-new drafter proposes after prefilling the whole history seq[:L] into `slot`."""
    d, cfg = make(tree, topk, depth, **kw)
    s = Slots(d, cfg, [world] * cfg.cache.max_batch_size)
    s.prefill(slot, L)
    return d.propose(s.inputs()), d


def assert_valid(tree, cfg, live):
    B, N = tree.tokens.shape
    assert N == cfg.shape.num_tree_slots
    for b in range(B):
        n = int(tree.num_nodes[b])
        assert n == (N if live[b] else 1)
        par = tree.parents[b].tolist()
        assert par[0] == -1 and all(0 <= par[i] < i for i in range(1, n)) and all(p == -1 for p in par[n:])
        assert all(0 <= t < V for t in tree.tokens[b].tolist())
        depth = [0] * n
        for i in range(1, n):
            depth[i] = depth[par[i]] + 1
        assert max(depth) <= cfg.shape.max_draft_len


CASES = [("linear", None, 4), ("dynamic", 3, 3), ("dynamic", 2, 4)]


@pytest.mark.parametrize("tree, topk, depth", CASES)
@pytest.mark.parametrize("samples", [False, True], ids=["argmax", "sampled"])
def test_drafts_are_valid_trees_and_idle_slots_draft_root_only(tree, topk, depth, samples):
    d, cfg = make(tree, topk, depth, samples=samples, dtype=torch.float32)
    worlds = [World(60, WIDTH, seed=s) for s in range(3)]
    s = Slots(d, cfg, worlds)
    s.prefill(0, 9)
    s.prefill(2, 5)
    t = d.propose(s.inputs())
    assert_valid(t, cfg, [True, False, True])
    tokens = t.tokens[0, 1:]  # drafts are target ids of draft-vocabulary tokens
    assert bool(d.model.t2d[tokens].all())
    if samples:
        N = cfg.shape.num_tree_slots
        probs = t.draft_probs  # [B, N, V]
        assert probs.shape == (3, N, V)
        has_children = torch.zeros(3, N, dtype=torch.bool)
        has_children[0, t.parents[0, 1:]] = True
        assert torch.allclose(probs[0].sum(-1), has_children[0].double().float(), atol=1e-5)
        assert float(probs[0][:, ~d.model.t2d].abs().max()) == 0.0  # mass only on the draft vocabulary
    else:
        assert t.draft_probs is None
    s.accept_path(0, 1)
    t2 = d.propose(s.inputs())
    assert_valid(t2, cfg, [True, False, True])


@settings(max_examples=12)
@given(case=st.sampled_from(CASES), layers=st.sampled_from([1, 2]), data=st.data())
def test_draft_after_partial_acceptance_equals_drafting_from_scratch_over_the_history(case, layers, data):
    """Also for a head of two draft layers: each layer's draft KV is corrected on its own.

    Both drafters run the ops' PyTorch references, as this test runs on a GPU machine (CPU
    tensors, no interpreter): the subject is the drafter's bookkeeping after an acceptance,
    which both sides share; interpreted, the Triton kernels took ~90% of its time (~100 s).
    The drafter with the kernels after random acceptances is test_eagle3_dense_after_acceptance's,
    and each kernel is compared with its reference in tests/kernels."""
    with references_on_cpu("cpu"):
        _partial_acceptance_equals_scratch(case, layers, data)


def _partial_acceptance_equals_scratch(case, layers, data):
    tree, topk, depth = case
    B = 3
    d, cfg = make(tree, topk, depth, B=B, num_layers=layers)
    worlds = [World(70, WIDTH, seed=data.draw(st.integers(0, 999)), dtype=torch.float64) for _ in range(B)]
    s = Slots(d, cfg, worlds)
    prompt = [data.draw(st.integers(1, 12)) for _ in range(B)]
    for slot in range(B):
        s.prefill(slot, prompt[slot])
    d.propose(s.inputs())
    for _ in range(data.draw(st.integers(1, 3))):
        accepted = [data.draw(st.integers(0, depth)) for _ in range(B)]
        note(f"accepted={accepted} committed={s.committed}")
        for slot in range(B):
            s.accept_path(slot, accepted[slot])
        tree_now = d.propose(s.inputs())
    for slot in range(B):
        ref, ref_d = fresh_tree(tree, topk, depth, worlds[slot], s.committed[slot], slot=slot, num_layers=layers)
        assert tree_now.tokens[slot].tolist() == ref.tokens[slot].tolist()
        assert tree_now.parents[slot].tolist() == ref.parents[slot].tolist()
        assert torch.allclose(d.root_logits[slot], ref_d.root_logits[slot], atol=1e-10)
        C = s.committed[slot]  # the draft KV of every committed position matches too
        pos = torch.arange(C)[None]
        for layer in range(layers):
            k, _ = d.cache.gather(layer, torch.tensor([slot]), pos)
            k_ref, _ = ref_d.cache.gather(layer, torch.tensor([slot]), pos)
            assert torch.allclose(k, k_ref, atol=1e-10)


def test_reset_slot_gives_root_only_trees_until_the_next_prefill_and_reuse_is_clean():
    d, cfg = make("dynamic", 2, 3)
    world = World(40, WIDTH, seed=5, dtype=torch.float64)
    other = World(40, WIDTH, seed=6, dtype=torch.float64)
    s = Slots(d, cfg, [other, world, world])
    s.prefill(0, 20)
    s.accept_path(0, 3)
    d.propose(s.inputs())
    d.reset_slot(0)
    t = d.propose(s.inputs())  # the engine still says active, but the slot has no draft state
    assert int(t.num_nodes[0]) == 1 and t.parents[0].tolist() == [-1] * cfg.shape.num_tree_slots
    s.worlds[0] = world
    s.prefill(0, 7)  # reused by a new request
    ref, _ = fresh_tree("dynamic", 2, 3, world, 7)
    again = d.propose(s.inputs())
    assert again.tokens[0].tolist() == ref.tokens[0].tolist()
    assert again.parents[0].tolist() == ref.parents[0].tolist()


def dense_path_logits(head, embed, next_tokens, hidden, path):
    """Reference: draft logits [Vd] after the prompt rows and then one row per token of `path`
    (target ids), with plain causal SDPA over every key so far (no paging, no tree masks)."""
    attend = [growing_sdpa(head.config.head_dim**-0.5) for _ in range(head.config.num_layers)]  # each layer's own keys
    L = next_tokens.shape[0]
    out, logits = head(embed(next_tokens[None]), hidden[None], torch.arange(L)[None], attend, first_step=True)
    h, last = out[:, -1:], logits[0, -1]
    for i, tok in enumerate(path):
        out, logits = head(embed(torch.tensor([[tok]])), h, torch.tensor([[L + i]]), attend, first_step=False)
        h, last = out, logits[0, -1]
    return last


@pytest.mark.parametrize("layers", [1, 2], ids=["one-layer", "two-layers"])
@pytest.mark.parametrize("tree, topk, depth", CASES)
def test_every_node_drafts_the_heads_top_k_along_its_own_path(tree, topk, depth, layers):
    """Catches wrong tree-attention masks (a node seeing its siblings), parent states or positions
    (and, with two draft layers, a layer reading another's keys)."""
    d, cfg = make(tree, topk, depth, B=2, num_layers=layers)
    world = World(40, WIDTH, seed=11, dtype=torch.float64)
    s = Slots(d, cfg, [world, world])
    s.prefill(1, 13)
    s.accept_path(1, 2)  # ingest a path too, so the prefix has both prefill and ingest rows
    t = d.propose(s.inputs())
    C = s.committed[1]
    next_tokens, hidden = world.prefill_args(C)
    K = topk or 1
    par, toks = t.parents[1].tolist(), t.tokens[1].tolist()
    n = int(t.num_nodes[1])
    for i in range(n):
        children = [toks[j] for j in range(1, n) if par[j] == i]
        if not children:
            continue
        path, j = [], i
        while j > 0:
            path.append(toks[j])
            j = par[j]
        ref = dense_path_logits(d.model, d.embed, next_tokens, hidden, path[::-1])
        best = d.model.draft_to_target(ref.topk(K).indices).tolist()
        assert set(children) <= set(best), (i, path, children, best)
        if len(children) == K:
            assert children == best  # kept in score order when the whole group survives


def test_first_step_is_an_explicit_flag_never_inferred_from_the_width():
    head = random_head()
    emb = torch.zeros(1, 2, D_T)
    pos = torch.zeros(1, 2, dtype=torch.int64)

    def attend(q, k, v):
        return q

    with pytest.raises(Eagle3ShapeError, match=r"later draft steps take the draft layer's own output of width d=32, got 96"):
        head(emb, torch.zeros(1, 2, WIDTH), pos, attend, first_step=False)
    with pytest.raises(Eagle3ShapeError, match=r"captured states of width 32; fc expects .* = 96"):
        head(emb, torch.zeros(1, 2, D_T), pos, attend, first_step=True)


def test_sampled_drafts_follow_the_tempered_draft_distribution_and_greedy_rows_are_untempered():
    d, cfg = make("linear", None, 2, B=2, samples=True, dtype=torch.float32)
    world = World(30, WIDTH, seed=2)
    s = Slots(d, cfg, [world, world])
    s.prefill(0, 8)
    s.prefill(1, 8)
    sampling = SamplingTensors.from_params([SamplingParams(temperature=0.5), SamplingParams()])
    t = d.propose(s.inputs(sampling))
    logits = d.root_logits[0]
    q_half = torch.softmax(logits / 0.5, -1)
    q_one = torch.softmax(logits, -1)
    ids = d.target_ids
    assert torch.allclose(t.draft_probs[0, 0, ids], q_half, atol=1e-6)
    assert torch.allclose(t.draft_probs[1, 0, ids], q_one, atol=1e-6)


def test_prefill_and_propose_reject_inputs_of_the_wrong_shape():
    d, cfg = make()
    with pytest.raises(ValueError, match="needs the captured target states"):
        d.prefill(0, torch.zeros(4, dtype=torch.int64), None)
    with pytest.raises(ValueError, match=r"hidden has shape \(3, 96\); expected \[4"):
        d.prefill(0, torch.zeros(4, dtype=torch.int64), torch.zeros(3, WIDTH))
    with pytest.raises(ValueError, match="slot=3 is out of range"):
        d.reset_slot(3)
    s = Slots(d, cfg, [World(20, WIDTH, dtype=torch.float64)] * 3)
    s.prefill(0, 5)
    inp = s.inputs()
    inp.hidden_path = torch.zeros(3, cfg.shape.num_tree_slots, 2 * D_T)
    with pytest.raises(ValueError, match=r"StepState.hidden_path has width 64; the EAGLE-3 head reads the captured target states .* of width 96"):
        d.propose(inp)


def test_logits_rows_gives_the_full_forwards_logits_at_those_rows_alone():
    """A prompt chunk's head runs on its last row only (`logits_rows`): the same logits as the
    full forward at that row, [B, 1, Vd], and the same hidden rows (float64)."""
    head = random_head(dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    emb = torch.randn(2, 5, D_T, generator=gen, dtype=torch.float64)
    hidden = torch.randn(2, 5, WIDTH, generator=gen, dtype=torch.float64)
    pos = torch.arange(5)[None].expand(2, -1)
    attend = lambda q, k, v: q  # noqa: E731  (the rows are what is compared, not the attention)
    out, logits = head(emb, hidden, pos, attend, first_step=True)
    rows = torch.tensor([4, 1])
    out_r, logits_r = head(emb, hidden, pos, attend, first_step=True, logits_rows=rows)
    assert logits_r.shape == (2, 1, logits.shape[-1])
    torch.testing.assert_close(logits_r[:, 0], logits[torch.arange(2), rows], rtol=1e-12, atol=1e-12)
    assert torch.equal(out_r, out)


@pytest.mark.parametrize("tree, topk, depth", CASES)
def test_rope_fused_into_the_draft_kv_write_drafts_the_same_trees(tree, topk, depth, monkeypatch):
    """The head's forwards store K/V through `write_rotated` (`attend.with_rope`): with the
    fused Triton kernel (as on CUDA; here interpreted) the trees and the draft KV equal those
    of the rotary piece followed by the plain write, across a prefill, a partial acceptance
    and a fully rejected step (the sink row, where the fused kernel drops padding rows, aside)."""
    import specdec.runtime.kv_cache as kv_cache

    fused_calls = []
    kernel = kv_cache.rope_kv_write_triton
    monkeypatch.setattr(kv_cache, "rope_kv_write_triton", lambda *a: fused_calls.append(1) or kernel(*a))
    runs = {}
    for impl in ("torch", "triton"):
        d, cfg = make(tree, topk, depth, dtype=torch.float32)
        d.rope_impl = impl
        s = Slots(d, cfg, [World(60, WIDTH, seed=s) for s in range(3)])
        s.prefill(0, 9)
        s.prefill(1, 6)
        first = d.propose(s.inputs())
        s.accept_path(0, 2)
        s.accept_path(1, 0)
        second = d.propose(s.inputs())
        runs[impl] = (first, second, torch.stack([d.cache.k(0), d.cache.v(0)]))  # the sink row left out
        # two prefills, D - 1 draft forwards, then the ingest and D - 1 again
        assert len(fused_calls) == (0 if impl == "torch" else 2 + (depth - 1) + depth)
    for want, got in zip(runs["torch"][:2], runs["triton"][:2]):
        assert torch.equal(want.tokens, got.tokens) and torch.equal(want.parents, got.parents)
        assert torch.equal(want.num_nodes, got.num_nodes)
    torch.testing.assert_close(runs["triton"][2], runs["torch"][2], rtol=1e-5, atol=1e-5)
