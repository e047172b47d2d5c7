"""Our decoder == transformers' forward (float32) for every family: prefill, paged decode, tree verify."""

from __future__ import annotations

import pytest
import torch
from _tiny_models import (
    DEVICE,
    FAMILIES,
    make_checkpoint,
    path_to,
    random_parents,
    rel_err,
    run_decode,
    run_prefill,
    run_tree,
    spec_config,
)

from specdec.models import load_target

TOL = 1e-4


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = make_checkpoint(request.param, folder)
    target = load_target(folder, device=DEVICE)
    return request.param, hf, target


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()  # [L, V]


def _prompts(gen, lengths, vocab):
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def test_prefill_logits_match_transformers(family):
    name, hf, target = family
    gen = torch.Generator().manual_seed(1)
    model = target.model
    cache = model.make_cache(spec_config())
    # Rows of different lengths (padding in the short one), slots out of order; length 21 > window 8.
    prompts = _prompts(gen, [21, 9], model.config.vocab_size)
    out, q_len = run_prefill(model, cache, prompts, slots=[2, 0])
    for b, p in enumerate(prompts):
        ref = _hf_logits(hf, p)
        err = rel_err(out.logits[b, : len(p)], ref)
        assert err < TOL, f"{name} row {b}: rel err {err:.2e}"
    assert out.last_hidden.shape == (2, 21, model.config.hidden_size)


def test_paged_decode_logits_match_transformers(family):
    name, hf, target = family
    gen = torch.Generator().manual_seed(2)
    model = target.model
    cache = model.make_cache(spec_config())
    prompts = _prompts(gen, [5, 11], model.config.vocab_size)
    run_prefill(model, cache, prompts, slots=[0, 1])
    seqs = [list(p) for p in prompts] + [[]]
    cache_len = torch.tensor([5, 11, 0])
    active = torch.tensor([True, True, False])  # slot 2 idle: a padding row
    steps = []
    for _ in range(10):  # crosses several 4-token blocks and the window of 8
        new = torch.randint(0, model.config.vocab_size, (3,), generator=gen)
        out = run_decode(model, cache, new, cache_len, active)  # helpers move inputs to DEVICE
        steps.append(out.logits[:, 0])  # [B, V]
        for b in (0, 1):
            seqs[b].append(int(new[b]))
        cache_len = cache_len + active.long()
    for b in (0, 1):
        ref = _hf_logits(hf, seqs[b])  # causal: row t == logits after token t
        L = len(prompts[b])
        for s, logits in enumerate(steps):
            err = rel_err(logits[b], ref[L + s])
            assert err < TOL, f"{name} slot {b} step {s}: rel err {err:.2e}"
    assert torch.all(steps[-1][2].isfinite())


def test_tree_verify_logits_match_each_path_through_transformers(family):
    name, hf, target = family
    gen = torch.Generator().manual_seed(3)
    model = target.model
    V = model.config.vocab_size
    cache = model.make_cache(spec_config(max_seq_len=80))
    prompts = _prompts(gen, [13, 6], V)
    run_prefill(model, cache, prompts, slots=[0, 1])
    N = 36  # > 32: the packed mask has two words
    parents = [random_parents(gen, 36), random_parents(gen, 7), []]  # slot 1 partly padding, slot 2 idle
    tokens = torch.randint(0, V, (3, N), generator=gen)
    out, _ = run_tree(model, cache, tokens, parents, torch.tensor([13, 6, 0]))
    for b in (0, 1):
        for i in range(len(parents[b])):
            path = [int(tokens[b, j]) for j in path_to(parents[b], i)]
            ref = _hf_logits(hf, prompts[b] + path)[-1]
            err = rel_err(out.logits[b, i], ref)
            assert err < TOL, f"{name} slot {b} node {i} (depth {len(path) - 1}): rel err {err:.2e}"


def test_logits_index_picks_rows_of_the_full_logits(family):
    _, _, target = family
    model = target.model
    gen = torch.Generator().manual_seed(4)
    cache = model.make_cache(spec_config())
    prompts = _prompts(gen, [7, 4], model.config.vocab_size)
    full, _ = run_prefill(model, cache, prompts, slots=[0, 1])
    cache2 = model.make_cache(spec_config())
    index = torch.tensor([[6, 0], [3, 3]], device=DEVICE)
    from specdec.runtime.batch import prefill_batch

    tokens = torch.zeros(2, 7, dtype=torch.int64)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = torch.tensor(p)
        cache2.reserve(b, len(p))
    kw = dict(device=DEVICE)
    batch = prefill_batch(cache2, torch.tensor([0, 1], **kw), torch.zeros(2, dtype=torch.int64, **kw), torch.tensor([7, 4], **kw), 7)
    with torch.no_grad():
        picked = model(tokens.to(DEVICE), batch.positions, cache2, batch, logits_index=index)
    assert picked.logits.shape == (2, 2, model.config.vocab_size)
    expect = torch.stack([full.logits[b, index[b]] for b in range(2)])
    torch.testing.assert_close(picked.logits, expect)


def test_bfloat16_model_tracks_float32_logits(family):
    """bf16 weights (RoPE frequencies stay float32) give logits close to the float32 model's."""
    name, _, target = family
    from specdec.models import load_target

    bf16 = load_target(target.path, dtype=torch.bfloat16, device=DEVICE).model
    assert bf16.rotary.inv_freq.dtype == torch.float32
    torch.testing.assert_close(bf16.rotary.inv_freq, target.model.rotary.inv_freq)
    gen = torch.Generator().manual_seed(5)
    prompt = _prompts(gen, [12], target.model.config.vocab_size)
    ref, _ = run_prefill(target.model, target.model.make_cache(spec_config()), prompt, slots=[0])
    out, _ = run_prefill(bf16, bf16.make_cache(spec_config()), prompt, slots=[0])
    assert out.logits.dtype == torch.float32
    assert rel_err(out.logits, ref.logits) < 0.05, name


def test_compiled_decode_step_has_no_graph_break_and_no_recompile(tmp_path):
    """fullgraph torch.compile of a decode step (with capture) matches eager; a second step reuses the graph."""
    from specdec.runtime.batch import decode_batch

    make_checkpoint("qwen3", tmp_path, num_hidden_layers=2)
    model = load_target(tmp_path, device=DEVICE).model
    config = spec_config(layers_to_capture=(0, 1))
    cache, capture = model.make_cache(config), model.make_capture(config)
    run_prefill(model, cache, [[1, 2, 3, 4, 5], [6, 7, 8]], slots=[0, 1])
    step = torch.compile(model, fullgraph=True, dynamic=False)
    cache_len = torch.tensor([5, 3, 0], device=DEVICE)
    active = torch.tensor([True, True, False], device=DEVICE)
    for s in range(2):
        for slot in (0, 1):
            cache.reserve(slot, int(cache_len[slot]) + 1)
        batch = decode_batch(cache, cache_len, active)
        tokens = torch.tensor([[9 + s], [10 + s], [0]], device=DEVICE)
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=s > 0):
            out = step(tokens, batch.positions, cache, batch, capture=capture)
        hidden = capture.rows(2).clone()
        with torch.no_grad():
            ref = model(tokens, batch.positions, cache, batch, capture=capture)
        assert rel_err(out.logits[:2], ref.logits[:2]) < TOL
        torch.testing.assert_close(hidden, capture.rows(2))
        cache_len = cache_len + active.long()
