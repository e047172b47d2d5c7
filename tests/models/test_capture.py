"""Hidden-state capture: rows == transformers' hidden states, real rows only, sizing and empty sets."""

from __future__ import annotations

import pytest
import torch
from _tiny_models import DEVICE, make_checkpoint, path_to, random_parents, rel_err, run_prefill, run_tree, spec_config
from hypothesis import given, note
from hypothesis import strategies as st

from specdec import ConfigError, SpecConfig
from specdec.models import CaptureBuffer, capture_max_tokens, load_target

L = 7  # > 5, so the EAGLE-3 default (1, L//2 - 1, L - 4) = (1, 2, 3) applies


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capture")
    hf = make_checkpoint("qwen2", folder, num_hidden_layers=L)  # has sliding + full layers
    return hf, load_target(folder, device=DEVICE)


def _hf_states(hf, ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(HF hidden_states as [len, d] each, the last layer's own output before the final norm)."""
    seen = {}
    handle = hf.model.layers[-1].register_forward_hook(lambda m, i, o: seen.setdefault("h", o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_hidden_states=True)
    finally:
        handle.remove()
    return [h[0] for h in out.hidden_states], seen["h"][0]


def _expected(hf, ids: list[int], layers) -> torch.Tensor:
    """[len(ids), d * n] what the buffer must hold for one sequence; hidden_states[l + 1] is layer l's output."""
    hs, last = _hf_states(hf, ids)
    return torch.cat([last if l == L - 1 else hs[l + 1] for l in layers], dim=-1)


@pytest.mark.parametrize("layers", [None, (0, 3, L - 1)], ids=["eagle3-default", "first-mid-last"])
def test_prefill_capture_rows_equal_transformers_hidden_states(tiny, layers):
    hf, target = tiny
    model = target.model
    config = spec_config(layers_to_capture=layers)
    capture = model.make_capture(config)
    assert capture.layers == ((1, 2, 3) if layers is None else layers)
    capture.buffer.fill_(float("nan"))  # anything not written stays NaN
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (5, 12, 3)]
    out, q_len = run_prefill(model, model.make_cache(config), prompts, slots=[1, 0, 2], capture=capture)
    total = int(q_len.sum())
    expect = torch.cat([_expected(hf, p, capture.layers) for p in prompts])  # rows in batch order
    got = capture.rows(total)
    assert not got.isnan().any(), "a real row was not written"
    assert rel_err(got, expect) < 1e-4
    assert capture.buffer[total:].isnan().all(), "padding rows were written into the buffer"
    # The final entry of HF's hidden_states is after the final norm: our last_hidden.
    for b, p in enumerate(prompts):
        hs, _ = _hf_states(hf, p)
        assert rel_err(out.last_hidden[b, : len(p)], hs[-1]) < 1e-4


def test_tree_capture_rows_follow_node_order_of_real_rows(tiny):
    hf, target = tiny
    model = target.model
    config = spec_config(layers_to_capture=(1, 4, L - 1))
    cache = model.make_cache(config)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (9, 4)]
    run_prefill(model, cache, prompts, slots=[0, 2])
    capture = model.make_capture(config)
    capture.buffer.fill_(float("nan"))
    N = 8
    parents = [random_parents(gen, 8), [], random_parents(gen, 5)]  # slot 1 idle: no rows
    tokens = torch.randint(0, 96, (3, N), generator=gen)
    run_tree(model, cache, tokens, parents, torch.tensor([9, 0, 4]), capture=capture)
    rows = []
    for b, prompt in ((0, prompts[0]), (2, prompts[1])):
        for i in range(len(parents[b])):
            ids = prompt + [int(tokens[b, j]) for j in path_to(parents[b], i)]
            rows.append(_expected(hf, ids, capture.layers)[-1])
    expect = torch.stack(rows)  # [8 + 5, d * 3]
    assert rel_err(capture.rows(13), expect) < 1e-4
    assert capture.buffer[13:].isnan().all()
    per_node = capture.gather(capture.row_index(torch.tensor([8, 0, 5], device=DEVICE), N))  # [B, N, d*3] forward layout
    torch.testing.assert_close(per_node[0], capture.rows(8))
    torch.testing.assert_close(per_node[2, :5], capture.rows(13)[8:])


@given(q_len=st.lists(st.integers(0, 6), min_size=1, max_size=5), T=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_row_index_packs_real_tokens_and_sends_padding_to_the_sink(q_len, T, seed):
    q_len = [min(q, T) for q in q_len]
    note(f"q_len={q_len} T={T}")
    B, d = len(q_len), 3
    buf = CaptureBuffer((2, 5), d, max_tokens=B * T + 1)
    buf.buffer.fill_(-1.0)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, d, generator=gen)
    rows = buf.row_index(torch.tensor(q_len), T)
    buf.write(5, hidden, rows)
    expect = torch.cat([hidden[b, : q_len[b]] for b in range(B)])  # [sum q_len, d]
    total = sum(q_len)
    torch.testing.assert_close(buf.layer_rows(5, total), expect, rtol=0, atol=0)
    assert (buf.buffer[total:] == -1).all()
    assert (buf.layer_rows(2, buf.max_tokens) == -1).all(), "only the written layer's columns change"


def test_buffer_size_follows_the_design_rule():
    config = SpecConfig(max_batch_size=4, max_seq_len=64, tree="dynamic", topk=3, max_draft_len=4, max_total_draft_tokens=9)
    assert capture_max_tokens(config) == 4 * 64 + 10 * 4
    assert capture_max_tokens(config, max_num_tokens=100) == 100 + 10 * 4
    buf = CaptureBuffer.for_config(config, num_layers=12, hidden_size=8)
    assert buf.layers == (1, 5, 8)
    assert buf.buffer.shape == (4 * 64 + 40, 24)


def test_empty_capture_set_allocates_nothing(tiny):
    _, target = tiny
    config = spec_config(layers_to_capture=())
    assert target.model.make_capture(config) is None
    with pytest.raises(ValueError, match="capture=None"):
        CaptureBuffer((), 8, 10)


def test_bad_capture_requests_are_clear_errors():
    with pytest.raises(ConfigError, match="out of range"):
        CaptureBuffer.for_config(spec_config(layers_to_capture=(1, 9)), num_layers=7, hidden_size=8)
    with pytest.raises(ConfigError, match="L > 5"):
        CaptureBuffer.for_config(spec_config(), num_layers=5, hidden_size=8)
    buf = CaptureBuffer((0,), 4, max_tokens=6)
    with pytest.raises(ValueError, match="max_tokens=6"):
        buf.row_index(torch.tensor([1, 1]), 4)
