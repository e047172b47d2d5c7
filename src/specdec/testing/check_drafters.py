"""Properties of drafters (`specdec_draft`), end to end on a tiny random target (CPU or GPU):

- every tree it proposes has the declared shape (`num_tree_slots`), topological parents,
  clean padding, tokens in the vocabulary, `draft_probs` exactly when it says it samples;
- greedy decoding with it (verifier="greedy") equals target-only decoding, token for token,
  under each built-in greedy tree policy it accepts;
- the same requests draft the same trees (determinism).

The contract is checked on every `propose` / `propose_host` call through a pluggy wrapper
around `specdec_draft` (`ContractChecker`), so any drafter, built-in or third party, is
checked as the engine really drives it; a request the engine fails (a broken contract, a
drafter that raises) fails the property with its error. Built-in heads (eagle3, mtp) get
random weights when no checkpoint is given; other drafters take their options from the user.
"""

from __future__ import annotations

import torch
from hypothesis import given, note
from hypothesis import strategies as st

from ..config import ConfigError, SamplingParams, SpecConfig
from ..drafters import eagle3_model, mtp_model
from ..entrypoints.decoder import SpecDecoder
from ..hookspecs import hookimpl
from ..models import DecoderLM, ModelConfig, RopeConfig
from ..models.loader import Target
from ..strategies import TargetInfo
from .kit import references_on_cpu, register

VOCAB, HIDDEN, LAYERS = 64, 32, 6
TREES = (dict(tree="linear", max_draft_len=3), dict(tree="dynamic", topk=2, max_draft_len=3, max_total_draft_tokens=5),
         dict(tree="static", max_draft_len=3, max_total_draft_tokens=6))


def tiny_target(device, seed: int = 0):
    """A 6-layer random Llama (V=64, d=32) with weights far from uniform."""
    cfg = ModelConfig(model_type="llama", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_layers=LAYERS,
                      num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope=RopeConfig(), max_position_embeddings=512)
    model = DecoderLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn(p.shape, generator=g) * 0.3)
    model.to(device)
    return Target(model, TargetInfo(LAYERS, HIDDEN, VOCAB, "llama", ()), None, None, cfg, None)


def builtin_options(name: str) -> dict:
    """Random heads for the built-in model drafters (no checkpoint needed); {} otherwise."""
    g = torch.Generator().manual_seed(1)
    if name == "eagle3":
        cfg = eagle3_model.Eagle3Config(
            hidden_size=HIDDEN, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            vocab_size=VOCAB, draft_vocab_size=40, target_hidden_size=HIDDEN, rms_norm_eps=1e-5,
            rope=RopeConfig(theta=10000.0), capture_layers=(1, 2, 4))
        return {"eagle3": {"model": eagle3_model.init_random_(eagle3_model.Eagle3Model(cfg), g, std=0.3).eval()}}
    if name == "mtp":
        cfg = mtp_model.MTPConfig(hidden_size=HIDDEN, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=8, vocab_size=VOCAB, rms_norm_eps=1e-5, rope=RopeConfig(theta=10000.0))
        return {"mtp": {"model": mtp_model.init_random_(mtp_model.MTPModel(cfg), g, std=0.3).eval()}}
    return {}


def check_draft(tokens, parents, num_nodes, active, n_slots: int, vocab: int, draft_probs=None, samples=False) -> None:
    """The `DraftTree` contract for one proposal (AssertionError names the broken rule)."""
    B = tokens.shape[0]
    for name, t, shape in (("tokens", tokens, (B, n_slots)), ("parents", parents, (B, n_slots)), ("num_nodes", num_nodes, (B,))):
        assert tuple(t.shape) == shape and t.dtype == torch.int64, f"{name} is {tuple(t.shape)} {t.dtype}; want {list(shape)} int64"
    assert (draft_probs is not None) == samples, f"draft_probs given={draft_probs is not None} but samples_drafts={samples}"
    toks, par, nn = tokens.cpu().tolist(), parents.cpu().tolist(), num_nodes.cpu().tolist()
    for b in range(B):
        n = nn[b]
        assert 1 <= n <= n_slots, f"row {b}: num_nodes={n} outside [1, {n_slots}]"
        if not active[b]:
            assert n == 1, f"row {b} is idle but drafts {n - 1} nodes"
        assert par[b][0] == -1, f"row {b}: the root's parent is {par[b][0]}, not -1"
        for i in range(1, n):
            assert 0 <= par[b][i] < i, f"row {b}: node {i} has parent {par[b][i]} (not topological)"
            assert 0 <= toks[b][i] < vocab, f"row {b}: node {i} token {toks[b][i]} outside [0, {vocab})"
        assert par[b][n:] == [-1] * (n_slots - n), f"row {b}: padding parents are not -1"


class CheckedDrafter:
    """Delegates to the real drafter; checks and logs every proposal."""

    def __init__(self, inner, vocab: int, log: list) -> None:
        self._inner, self._vocab, self._log = inner, vocab, log

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def propose(self, state, max_kv_len=None, draft=True):
        tree = self._inner.propose(state, max_kv_len=max_kv_len, draft=draft)
        check_draft(tree.tokens, tree.parents, tree.num_nodes, state.active.cpu().tolist(), self._inner.num_tree_slots,
                    self._vocab, tree.draft_probs, self._inner.samples_drafts)
        self._log.append((tree.tokens.cpu(), tree.parents.cpu(), tree.num_nodes.cpu()))
        return tree

    def propose_host(self, accept_length, accept_tokens, root_tokens, active):
        tokens, parents, num_nodes = self._inner.propose_host(accept_length, accept_tokens, root_tokens, active)
        check_draft(tokens, parents, num_nodes, active, self._inner.num_tree_slots, self._vocab)
        self._log.append((tokens.cpu(), parents.cpu(), num_nodes.cpu()))
        return tokens, parents, num_nodes


class ContractChecker:
    """A pluggy plugin wrapping whatever `specdec_draft` returns in a `CheckedDrafter`."""

    def __init__(self) -> None:
        self.log: list = []

    @hookimpl(wrapper=True)
    def specdec_draft(self, config, target):
        drafter = yield
        return None if drafter is None else CheckedDrafter(drafter, target.vocab_size, self.log)


def _decoder(subject, target, shape: dict, checker: ContractChecker | None):
    """A greedy SpecDecoder with the subject's drafter under `shape`; the checker (if any) is
    registered only while the strategies are resolved."""
    options = {**builtin_options(subject.name), **subject.options}
    fields = dict(max_batch_size=3, max_seq_len=96, kv_block_size=4, compile=False, cuda_graphs=False)
    config = SpecConfig(**{**fields, **subject.config, **shape, "drafter": subject.name, "verifier": "greedy",
                           "plugin_options": options})
    if checker is None:
        return SpecDecoder(target, config, pm=subject.pm)
    subject.pm.register(checker)
    try:
        return SpecDecoder(target, config, pm=subject.pm)
    finally:
        subject.pm.unregister(checker)


def _run(dec, prompts, new):
    """Each prompt's new tokens. A request the engine failed (the drafter raised, or broke the
    contract the `ContractChecker` asserts) fails the check with its error: the engine turns
    a step's exception into ``finish_reason="error"`` and a warning, not a raise."""
    results = dec.generate(prompts, SamplingParams(max_new_tokens=new, ignore_eos=True))
    for i, r in enumerate(results):
        assert r.stats.finish_reason != "error", f"tree={dec.config.tree!r}: prompt {i} failed: {r.stats.error}"
    return [r.token_ids for r in results]


@st.composite
def requests(draw):
    prompts = draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), min_size=1, max_size=3))
    return prompts, draw(st.integers(4, 16))


def _shapes(subject, target):
    """The built-in greedy tree shapes this drafter accepts (ConfigError = it refuses one)."""
    out = []
    for shape in TREES:
        try:
            _decoder(subject, target, shape, None)
        except ConfigError:
            continue
        out.append(shape)
    assert out, f"drafter {subject.name!r} accepts none of the tree shapes {[s['tree'] for s in TREES]}"
    return out


@register("drafter", "every proposed tree has the declared shape, topological parents and clean padding", ci=3, gpu=10)
def drafts_keep_the_tree_contract(subject, ctx):
    target = tiny_target(ctx.device)
    with references_on_cpu(ctx.device):
        shapes = _shapes(subject, target)

        @ctx.settings_for(drafts_keep_the_tree_contract)
        @given(req=requests())
        def check(req):
            note(f"prompts={req[0]} new={req[1]}")
            for shape in shapes:
                checker = ContractChecker()
                _run(_decoder(subject, target, shape, checker), *req)
                assert checker.log, f"tree={shape['tree']!r}: the drafter never proposed a tree"

        check()


@register("drafter", "greedy decoding with it equals target-only decoding", ci=3, gpu=10)
def greedy_output_equals_target_only(subject, ctx):
    target = tiny_target(ctx.device)
    with references_on_cpu(ctx.device):
        shapes = _shapes(subject, target)
        base = SpecDecoder(target, SpecConfig(max_batch_size=3, max_seq_len=96, kv_block_size=4, compile=False, cuda_graphs=False))

        @ctx.settings_for(greedy_output_equals_target_only)
        @given(req=requests())
        def check(req):
            note(f"prompts={req[0]} new={req[1]}")
            want = _run(base, *req)
            for shape in shapes:
                got = _run(_decoder(subject, target, shape, None), *req)
                assert got == want, f"tree={shape['tree']!r}: {got} != target-only {want}"

        check()


@register("drafter", "the same requests draft the same trees", ci=2, gpu=10)
def drafting_is_deterministic(subject, ctx):
    target = tiny_target(ctx.device)
    with references_on_cpu(ctx.device):
        shapes = _shapes(subject, target)

        @ctx.settings_for(drafting_is_deterministic)
        @given(req=requests())
        def check(req):
            note(f"prompts={req[0]} new={req[1]}")
            for shape in shapes:
                logs = []
                for _ in range(2):
                    checker = ContractChecker()
                    _run(_decoder(subject, target, shape, checker), *req)
                    logs.append(checker.log)
                assert len(logs[0]) == len(logs[1]), f"tree={shape['tree']!r}: {len(logs[0])} vs {len(logs[1])} proposals"
                for step, (a, b) in enumerate(zip(*logs)):
                    assert all(torch.equal(x, y) for x, y in zip(a, b)), f"tree={shape['tree']!r}: proposal {step} differs"

        check()
