"""sampling_probs (temperature -> top-k -> top-p -> min-p, per request) against a naive
per-row implementation, and the draw rule of sample_from_probs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.ops import sample_from_probs, sampling_probs

from _naive_probs import naive_probs


@st.composite
def rows(draw, batch: int):
    out = []
    for _ in range(batch):
        out.append(
            dict(
                temperature=draw(st.sampled_from([0.0, 0.3, 1.0, 2.5])),
                top_k=draw(st.sampled_from([0, 1, 2, 5, 1000])),
                top_p=draw(st.sampled_from([1.0, 0.9, 0.5, 0.05])),
                min_p=draw(st.sampled_from([0.0, 0.1, 0.5])),
            )
        )
    return out


@given(data=st.data(), batch=st.integers(1, 5), slots=st.integers(1, 3), vocab=st.sampled_from([1, 2, 7, 33]), seed=st.integers(0, 2**31 - 1))
def test_sampling_probs_match_a_naive_per_row_filter(data, batch, slots, vocab, seed):
    params = data.draw(rows(batch))
    note(repr(params))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(-8, 8, (batch, slots, vocab), generator=g).float() / 2  # ties happen
    got = sampling_probs(
        logits,
        torch.tensor([r["temperature"] for r in params]),
        torch.tensor([r["top_k"] for r in params]),
        torch.tensor([r["top_p"] for r in params]),
        torch.tensor([r["min_p"] for r in params]),
    )
    assert got.dtype == torch.float32 and got.shape == logits.shape
    for b, r in enumerate(params):
        for i in range(slots):
            want = torch.tensor(naive_probs(logits[b, i].tolist(), **r), dtype=torch.float64)
            assert torch.equal(got[b, i] > 0, want > 0), (b, i, got[b, i], want)
            torch.testing.assert_close(got[b, i].double(), want, atol=2e-6, rtol=0)


def test_filters_apply_in_the_documented_order():
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    one = lambda x, dtype=torch.float32: torch.tensor([x], dtype=dtype)  # noqa: E731
    # top-k 3 first: [.444, .333, .222]; then top-p .75 keeps two (mass before the third is .777)
    p = sampling_probs(logits, one(1.0), one(3, torch.int64), one(0.75), one(0.0))
    torch.testing.assert_close(p[0], torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))
    # (top-p on the unfiltered distribution would have kept three)
    p = sampling_probs(logits, one(1.0), one(0, torch.int64), one(0.75), one(0.0))
    torch.testing.assert_close(p[0], torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0]))
    # min-p last: 0.8 * 4/7 > 3/7 leaves the top token alone
    p = sampling_probs(logits, one(1.0), one(3, torch.int64), one(0.75), one(0.8))
    assert p[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_greedy_rows_are_exactly_one_hot_at_the_first_argmax_in_a_mixed_batch():
    logits = torch.tensor([[[1.0, 3.0, 3.0, -1.0]], [[1.0, 3.0, 3.0, -1.0]]], dtype=torch.bfloat16)
    p = sampling_probs(logits, torch.tensor([0.0, 1.0]), torch.tensor([5, 0]), torch.tensor([0.5, 1.0]), torch.tensor([0.0, 0.0]))
    assert p[0, 0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert (p[1, 0] > 0).all() and abs(float(p[1, 0].sum()) - 1) < 1e-6
    flat = sampling_probs(logits[:, 0], torch.tensor([0.0, 1.0]), torch.tensor([5, 0]), torch.tensor([0.5, 1.0]), torch.tensor([0.0, 0.0]))
    assert torch.equal(flat, p[:, 0])


def test_sampling_probs_names_a_misshapen_parameter():
    with pytest.raises(ValueError, match=r"top_p must be \[2\]"):
        sampling_probs(torch.zeros(2, 5), torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.ones(3), torch.zeros(2))


def test_sample_from_probs_is_the_inverse_cdf_and_never_draws_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]]).expand(5, 5)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.9, 1 - 2**-53], dtype=torch.float64)
    assert sample_from_probs(probs, u).tolist() == [1, 1, 3, 3, 3]
    with pytest.raises(ValueError, match=r"uniforms must be \(5,\)"):
        sample_from_probs(probs, u[:3])


def test_sample_from_probs_follows_the_distribution():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    n = 2**16
    draws = sample_from_probs(p.expand(n, 4), torch.rand(n, generator=g, dtype=torch.float64))
    freq = torch.bincount(draws, minlength=4).double() / n
    tau = 0.5 * math.sqrt(3 / n) + math.sqrt(math.log(1e6) / (2 * n))  # see test_sampling_distribution
    assert 0.5 * float((freq - p.double()).abs().sum()) <= tau and freq[1] == 0


@given(data=st.data(), rows=st.integers(1, 4), vocab=st.sampled_from([1, 2, 5, 33]), seed=st.integers(0, 2**31 - 1))
def test_a_greedy_rows_draw_is_its_argmax_whatever_the_uniform(data, rows, vocab, seed):
    """What the engine's greedy first token relies on (`SpecEngine._first_tokens` takes the
    argmax when every request of a prefill group is greedy): the draw from a temperature-0 row
    is its first argmax for any uniform in [0, 1), ties included."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-2, 3, (rows, vocab), generator=gen).float()  # few values: many ties
    u = torch.tensor(data.draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=rows, max_size=rows)), dtype=torch.float64)
    zeros = torch.zeros(rows)
    probs = sampling_probs(logits, zeros, zeros.long(), torch.ones(rows), zeros)
    assert torch.equal(sample_from_probs(probs, u), logits.argmax(-1))
