"""`runtime.bucket_graphs`: the (rows, length) buckets, the padded static inputs, and the
run/replay bookkeeping (the prefill paths through them are compared with the eager prefill
in `test_chunked_prefill_drafter.py`; the captured graphs run in the CUDA tests of the
compiled step)."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime.bucket_graphs import BucketGraphs, PaddedChunks, bucket_grid, length_buckets, row_buckets


@pytest.mark.parametrize("max_len, want", [
    (512, (16, 32, 64, 128, 256, 384, 512)),
    (100, (16, 32, 64, 100)),
    (300, (16, 32, 64, 128, 256, 300)),
    (16, (16,)),
    (1, (1,)),
])
def test_length_buckets_double_then_step_by_128(max_len, want):
    assert length_buckets(max_len) == want


@pytest.mark.parametrize("max_rows, want", [(1, (1,)), (3, (1, 2, 3)), (4, (1, 2, 4)), (64, (1, 2, 4, 8, 16, 32, 64))])
def test_row_buckets_double_up_to_the_batch(max_rows, want):
    assert row_buckets(max_rows) == want


def test_the_grid_keeps_rows_times_length_within_the_token_budget():
    grid = bucket_grid(64, 512, 512)
    assert all(r * T <= 512 for r, T in grid) and (1, 512) in grid and (32, 16) in grid and (64, 16) not in grid
    assert len(grid) == 7 + 5 + 4 + 3 + 2 + 1  # rows 1, 2, 4, 8, 16, 32
    with pytest.raises(ValueError, match="no bucket fits max_tokens=8"):
        bucket_grid(4, 64, 8)


@pytest.mark.parametrize("bad", [length_buckets, row_buckets])
def test_empty_ranges_are_refused(bad):
    with pytest.raises(ValueError, match="=0 must be >= 1"):
        bad(0)


def test_a_group_runs_in_the_smallest_bucket_that_holds_it():
    calls = []
    graphs = BucketGraphs(lambda key: calls.append(key) or torch.full(key, key[1]), bucket_grid(4, 100, 128))
    assert graphs.bucket(1, 1) == (1, 16) and graphs.bucket(1, 17) == (1, 32) and graphs.bucket(1, 100) == (1, 100)
    assert graphs.bucket(3, 20) == (4, 32) and graphs.bucket(2, 64) == (2, 64)
    assert graphs.bucket(4, 64) is None  # 4 x 64 is over the 128-token budget: eager
    assert graphs.bucket(5, 16) is None and graphs.bucket(1, 101) is None  # beyond the grid: eager
    assert graphs.key_for([3, 20, 5], [0, 0, 0]) == (4, 32)
    assert graphs.key_for([3, 20], [0, 7]) is None  # a chunk that continues its prompt: eager
    assert graphs.run((2, 32)).shape == (2, 32) and calls == [(2, 32)]  # not captured: the forward itself
    with pytest.raises(ValueError, match=r"rows=0 and length=3 must be >= 1"):
        graphs.bucket(0, 3)
    with pytest.raises(ValueError, match=r"key=\(2, 33\) is not a bucket"):
        graphs.run((2, 33))


@pytest.mark.parametrize("keys", [(), ((1, 16), (1, 16)), ((0, 4),)])
def test_keys_must_be_distinct_and_positive(keys):
    with pytest.raises(ValueError, match="must be distinct"):
        BucketGraphs(lambda key: None, keys)


def test_padded_chunks_repeat_row_zero_in_the_padding_rows():
    c = PaddedChunks(4, 32, "cpu", width=2, dtype=torch.float32)
    chunks = [torch.tensor([5, 6, 7]), torch.tensor([9])]
    states = [torch.ones(3, 2), torch.full((1, 2), 2.0)]
    c.fill((4, 8), [2, 0], chunks, states)
    assert c.slots.tolist() == [2, 0, 2, 2] and c.q_len.tolist() == [3, 1, 3, 3]
    assert c.tokens((4, 8))[:, :3].tolist() == [[5, 6, 7], [9, 0, 0], [5, 6, 7], [5, 6, 7]]
    assert c.states((4, 8))[1, 0].tolist() == [2.0, 2.0] and c.states((4, 8))[3, :3].tolist() == [[1.0, 1.0]] * 3
    assert c.tokens((2, 16)).shape == (2, 16) and c.states((2, 16)).shape == (2, 16, 2)  # views of one flat buffer


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_buckets_replay_the_current_inputs():
    """A replay reads what the owner's buffers hold now, not what they held at capture."""
    x = torch.zeros(2, 64, device="cuda")
    graphs = BucketGraphs(lambda key: x[: key[0], : key[1]] * 2 + 1, bucket_grid(2, 64, 128))
    assert graphs.capture(torch.device("cuda")) == 6
    x.copy_(torch.arange(128.0, device="cuda").view(2, 64))
    out = graphs.run((2, 32))
    torch.testing.assert_close(out, torch.arange(128.0, device="cuda").view(2, 64)[:, :32] * 2 + 1)
