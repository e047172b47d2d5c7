"""Every allowed range, tested on both sides of each edge: the last value inside passes, the
first value outside is a `ConfigError` that names the value and the range. An off-by-one in
a bound (`<` for `<=`) passes tests that probe far from the edge; these probe the edge.

Config fields (`SpecConfig`, `SamplingParams`) and the per-request rules of
`validation.check_request` (token ids one past the vocabulary, `top_k` one past it, prompt +
new tokens + drafted positions one past `max_seq_len` or the model's context).
"""

from __future__ import annotations

import pytest

from specdec import ConfigError, SamplingParams, SpecConfig
from specdec.config import MAX_TREE_SLOTS
from specdec.validation import check_request

# field -> (last inside below, first outside below, last inside above, first outside above, extra kw)
SPEC_EDGES = {
    "max_draft_len": (1, 0, 64, 65, {}),
    "max_batch_size": (1, 0, 4096, 4097, {}),
    "kv_block_size": (1, 0, 4096, 4097, {}),
    "num_kv_blocks": (1, 0, None, None, {}),
    "prefill_chunk_size": (1, 0, 1 << 20, (1 << 20) + 1, {}),
    "kv_lookahead_steps": (1, 0, 1024, 1025, {}),
    "topk": (1, 0, 64, 65, {}),
    "max_total_draft_tokens": (1, 0, MAX_TREE_SLOTS - 1, MAX_TREE_SLOTS, dict(max_seq_len=1 << 13)),
    "threads": (1, 0, 1024, 1025, {}),
}
SAMPLING_EDGES = {
    "top_k": (0, -1, None, None),
    "seed": (0, -1, 2**63 - 1, 2**63),
    "max_new_tokens": (1, 0, None, None),
    "num_draft_tokens": (0, -1, None, None),
}


def _cases(edges):
    for name, (lo, below, hi, above, *extra) in edges.items():
        kw = extra[0] if extra else {}
        yield pytest.param(name, lo, True, kw, id=f"{name}={lo}")
        yield pytest.param(name, below, False, kw, id=f"{name}={below}")
        if hi is not None:
            yield pytest.param(name, hi, True, kw, id=f"{name}={hi}")
            yield pytest.param(name, above, False, kw, id=f"{name}={above}")


@pytest.mark.parametrize("name, value, ok, kw", list(_cases(SPEC_EDGES)))
def test_spec_config_ranges_at_their_edges(name, value, ok, kw):
    if ok:
        assert SpecConfig(**{**kw, name: value}).flat()[name] == value
    else:
        with pytest.raises(ConfigError, match=rf"^{name}={value} is out of range; allowed: "):
            SpecConfig(**{**kw, name: value})


def test_max_seq_len_at_its_edges():
    # below: it must exceed the tree slots N = max_total_draft_tokens + 1 (the real lower edge)
    assert SpecConfig(max_draft_len=1, max_seq_len=3).cache.max_seq_len == 3
    with pytest.raises(ConfigError, match=r"^max_seq_len=2 must exceed the tree slots N=2"):
        SpecConfig(max_draft_len=1, max_seq_len=2)
    assert SpecConfig(max_seq_len=1 << 20).cache.max_seq_len == 1 << 20
    with pytest.raises(ConfigError, match=rf"^max_seq_len={(1 << 20) + 1} is out of range; allowed: "):
        SpecConfig(max_seq_len=(1 << 20) + 1)


@pytest.mark.parametrize("name, value, ok, kw", list(_cases({k: (*v, {}) for k, v in SAMPLING_EDGES.items()})))
def test_sampling_param_ranges_at_their_edges(name, value, ok, kw):
    if ok:
        assert getattr(SamplingParams(**{name: value}), name) == value
    else:
        with pytest.raises(ConfigError, match=rf"^{name}={value} is out of range; allowed: "):
            SamplingParams(**{name: value})


@pytest.mark.parametrize("name, inside, outside, allowed", [
    ("temperature", 0.0, -1e-9, r"finite and >= 0"),
    ("top_p", 1.0, 1.0 + 1e-9, r"\(0, 1\]"),
    ("top_p", 1e-9, 0.0, r"\(0, 1\]"),
    ("min_p", 0.0, -1e-9, r"\[0, 1\]"),
    ("min_p", 1.0, 1.0 + 1e-9, r"\[0, 1\]"),
])
def test_float_ranges_at_their_edges(name, inside, outside, allowed):
    assert getattr(SamplingParams(**{name: inside}), name) == inside
    with pytest.raises(ConfigError, match=rf"^{name}=.* is out of range; allowed: {allowed}"):
        SamplingParams(**{name: outside})


V, MAX_SEQ, LOOKAHEAD, CONTEXT = 96, 64, 6, 40


def _check(prompt, params, max_positions=None):
    check_request(prompt, params, vocab_size=V, max_seq_len=MAX_SEQ, max_positions=max_positions,
                  lookahead=LOOKAHEAD, greedy_only=False)


def test_token_ids_at_the_vocabulary_edge():
    _check([0, V - 1], SamplingParams(max_new_tokens=4))
    with pytest.raises(ConfigError, match=rf"prompt token ids \[{V}\] are out of range; allowed: \[0, {V}\)"):
        _check([0, V], SamplingParams(max_new_tokens=4))
    with pytest.raises(ConfigError, match=r"prompt token ids \[-1\] are out of range"):
        _check([-1], SamplingParams(max_new_tokens=4))
    _check([1], SamplingParams(max_new_tokens=4, stop_token_ids=(V - 1,)))
    with pytest.raises(ConfigError, match=rf"stop_token_ids \[{V}\] are out of range; allowed: \[0, {V}\)"):
        _check([1], SamplingParams(max_new_tokens=4, stop_token_ids=(V,)))


def test_top_k_at_the_vocabulary_edge():
    _check([1], SamplingParams(max_new_tokens=4, temperature=1.0, top_k=V))
    with pytest.raises(ConfigError, match=rf"top_k={V + 1} is out of range; allowed: \[0, {V}\]"):
        _check([1], SamplingParams(max_new_tokens=4, temperature=1.0, top_k=V + 1))


def test_lengths_at_max_seq_len_and_the_model_context():
    prompt = [1] * 10
    fits = MAX_SEQ - len(prompt) - LOOKAHEAD
    _check(prompt, SamplingParams(max_new_tokens=fits))
    with pytest.raises(ConfigError, match=rf"= {MAX_SEQ + 1} exceeds max_seq_len={MAX_SEQ}"):
        _check(prompt, SamplingParams(max_new_tokens=fits + 1))
    _check(prompt, SamplingParams(max_new_tokens=CONTEXT - len(prompt)), max_positions=CONTEXT)
    with pytest.raises(ConfigError, match=rf"= {CONTEXT + 1} exceeds the model's context max_position_embeddings={CONTEXT}"):
        _check(prompt, SamplingParams(max_new_tokens=CONTEXT - len(prompt) + 1), max_positions=CONTEXT)
