"""ops.top_logprobs (chunked top-k and log-sum-exp, the draft step's candidate selection)
against its reference: the whole log-softmax, cleaned, then one top-k."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdec.ops.top_logprobs import MIN_CHUNK, chunk_count, top_logprobs, top_logprobs_ref
from tree_cases import DEVICE

# Row lengths: tiny, not divisible by any chunk count, the shipped heads' draft vocabularies
# (4096 before, 16384 now, 32000 published EAGLE-3, 49152 SmolLM2's whole vocabulary for MTP).
VOCABS = [1, 5, 131, 300, 4096, 16384, 32000, 49152]


def distinct_logits(lead: tuple[int, ...], vocab: int, seed: int, spread: float) -> torch.Tensor:
    """Logits with pairwise distinct values (a random permutation of an even grid), so the top-k
    tokens and their order are unique."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(vocab, generator=g) for _ in range(max(1, int(torch.tensor(lead).prod())))]
    grid = torch.stack(rows).float() * (spread / max(1, vocab))
    return (grid - spread / 2).view(*lead, vocab)


@pytest.mark.parametrize(
    "vocab, k, chunks",
    [(16384, 8, 64), (16384, 1, 64), (4096, 1, 32), (4096, 10, 32), (32000, 10, 64), (49152, 8, 64),
     (300, 1, 2), (131, 1, 1), (256, 200, 1), (49157, 4, 1)],
)
def test_chunk_count_divides_the_row_into_chunks_no_shorter_than_k_and_min_chunk(vocab, k, chunks):
    assert chunk_count(vocab, k) == chunks
    s = chunk_count(vocab, k)
    assert vocab % s == 0 and (s == 1 or vocab // s >= max(k, MIN_CHUNK))


@pytest.mark.gpu
@given(vocab=st.sampled_from(VOCABS), k=st.integers(1, 12), batch=st.integers(1, 3), frontier=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1), spread=st.sampled_from([0.5, 8.0, 60.0]))
def test_top_logprobs_equal_the_reference_on_distinct_logits(vocab, k, batch, frontier, seed, spread):
    k = min(k, vocab)
    logits = distinct_logits((batch, frontier), vocab, seed, spread).to(DEVICE)
    tok, lp = top_logprobs(logits, k, impl="ref")  # the PyTorch path; the kernels' test is below
    want_tok, want_lp = top_logprobs_ref(logits, k)
    assert tok.shape == lp.shape == (batch, frontier, k)
    assert tok.dtype == torch.int64 and lp.dtype == torch.float32
    assert torch.equal(tok, want_tok)
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=2e-5)
    assert bool((lp <= 0).all())


@pytest.mark.gpu
@given(vocab=st.sampled_from([300, 4096]), k=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_top_logprobs_take_bf16_logits_as_the_drafter_gives_them(vocab, k, seed):
    logits = distinct_logits((2, 3), vocab, seed, 30.0).to(DEVICE, torch.bfloat16)  # ties after rounding
    tok, lp = top_logprobs(logits, k, impl="ref")  # the kernels take bf16 in the test below
    _, want_lp = top_logprobs_ref(logits, k)
    # Ties may be ordered differently: the values, and each token's own log-probability, agree.
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=2e-5)
    full = torch.log_softmax(logits.float(), -1).gather(-1, tok)
    torch.testing.assert_close(lp, full, rtol=0, atol=2e-5)


@pytest.mark.parametrize("k", [1, 5])  # 1: the reductions-only path (`_top1`)
@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_nan_logits_rank_last_and_give_minus_inf(k, impl):
    logits = torch.randn(2, 1, 4096, generator=torch.Generator().manual_seed(0))
    logits[0, 0, ::2] = float("nan")  # half the row
    logits[1, 0, :] = float("nan")  # the whole row
    tok, lp = top_logprobs(logits.to(DEVICE), k, impl=impl)
    tok, lp = tok.cpu(), lp.cpu()
    assert bool((logits[0, 0, tok[0, 0]].isfinite()).all())  # NaN tokens never picked while finite ones remain
    assert bool(lp[0].isfinite().all())
    assert bool((lp[1] == float("-inf")).all()) and bool(((tok[1] >= 0) & (tok[1] < 4096)).all())


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_infinite_logits_never_give_nan_or_positive_log_probabilities(k, impl):
    logits = torch.zeros(4, 1, 4096)
    logits[0, 0, 7] = float("inf")
    logits[1, 0, :] = float("-inf")
    logits[2, 0, 100:] = float("-inf")  # 100 finite entries in the first chunk
    logits[3, 0, :] = float("-inf")
    logits[3, 0, 200:300] = -200.0  # far below 0, the other chunks empty: exp(0 + 200) overflows float32
    tok, lp = top_logprobs(logits.to(DEVICE), k, impl=impl)
    tok, lp = tok.cpu(), lp.cpu()
    assert int(tok[0, 0, 0]) == 7 and float(lp[0, 0, 0]) == 0.0  # +inf counts as the largest float32
    assert not bool(lp.isnan().any()) and bool((lp <= 0).all())
    assert bool((tok[2] < 100).all()) and bool(((tok[3] >= 200) & (tok[3] < 300)).all())
    for row, n in ((2, 100.0), (3, 100.0)):
        torch.testing.assert_close(lp[row], torch.full((1, k), -torch.log(torch.tensor(n)).item()))


def test_k_outside_the_row_is_an_error_naming_the_range():
    with pytest.raises(ValueError, match=r"k=9 must be in \[1, 8\]"):
        top_logprobs(torch.zeros(1, 8), 9)


@pytest.mark.gpu
def test_top_logprobs_compile_fullgraph_with_dynamic_shapes_and_match_eager(device):
    impl = "auto" if device.type == "cuda" else "ref"  # a compiled CPU graph takes the PyTorch path
    fn = torch.compile(functools.partial(top_logprobs, impl=impl), dynamic=True, fullgraph=True)
    for batch, frontier, k in ((1, 1, 1), (2, 8, 8), (3, 5, 8)):  # one graph for every batch and frontier
        logits = distinct_logits((batch, frontier), 16384, batch, 20.0).to(device)
        tok, lp = fn(logits, k)
        want_tok, want_lp = top_logprobs(logits, k, impl=impl)
        assert torch.equal(tok, want_tok)
        torch.testing.assert_close(lp, want_lp, rtol=0, atol=2e-5)


# ---------------------------------------------------------------- the Triton kernels (k > 1)
# Interpreted on CPU every program runs in Python: rows and vocabularies stay small here, and one
# case per shipped draft vocabulary runs below.
@pytest.mark.gpu
@given(vocab=st.sampled_from([2, 5, 131, 300, 1024, 4096]), k=st.integers(2, 16), rows=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1), spread=st.sampled_from([0.5, 8.0, 60.0]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_kernels_give_the_pytorch_paths_tokens_and_log_probabilities(vocab, k, rows, seed, spread, dtype):
    k = min(k, vocab)
    logits = distinct_logits((rows,), vocab, seed, spread).to(DEVICE, dtype)  # bf16 rounding makes ties
    tok, lp = top_logprobs(logits, k, impl="triton")
    want_tok, want_lp = top_logprobs(logits, k, impl="ref")
    assert tok.dtype == torch.int64 and lp.dtype == torch.float32 and tok.shape == (rows, k)
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=2e-5)
    if dtype == torch.float32:  # distinct values: one answer
        assert torch.equal(tok, want_tok)
    else:  # ties go to the lower token id here; each token's own log-probability agrees
        assert bool((tok.sort(-1).values.diff(dim=-1) > 0).all())  # distinct tokens
        full = torch.log_softmax(logits.float(), -1).gather(-1, tok)
        torch.testing.assert_close(lp, full, rtol=0, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab, k", [(16384, 8), (32000, 10), (49152, 8)])
def test_kernels_match_at_the_shipped_draft_vocabularies(vocab, k):
    logits = distinct_logits((2,), vocab, vocab + k, 30.0).to(DEVICE)
    tok, lp = top_logprobs(logits, k, impl="triton")
    want_tok, want_lp = top_logprobs_ref(logits, k)
    assert torch.equal(tok, want_tok)
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=2e-5)


def test_equal_logits_go_to_the_lower_token_id_in_the_kernels():
    logits = torch.zeros(1, 4096).to(DEVICE)  # every token ties
    logits[0, 3000] = 1.0
    tok, lp = top_logprobs(logits, 4, impl="triton")
    assert tok.cpu().tolist() == [[3000, 0, 1, 2]]


def test_impl_triton_outside_the_kernels_range_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"k=17 must be in \[2, 16\]"):
        top_logprobs(torch.zeros(1, 4096).to(DEVICE), 17, impl="triton")


def test_the_kernels_launch_through_a_custom_op_that_compiled_pieces_call_whole():
    # A plain launcher inside a compiled piece made Dynamo trace `wrap_triton` and fail on every tree setup
    # on the H200 (fcecbb9, notes/gpu/check_fcecbb9_failed). The CPU cannot compile the CUDA path, so what is
    # checked here is that the launcher is the registered op a graph calls as one node, and that it computes.
    op = torch.ops.specdec.top_logprobs.default
    logits = distinct_logits((2,), 4096, 7, 30.0).to(DEVICE)
    tok, lp = op(logits, 8, chunk_count(4096, 8))
    want_tok, want_lp = top_logprobs_ref(logits, 8)
    assert torch.equal(tok, want_tok)
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=2e-5)
