"""`runtime.bucket_graphs`: the length buckets and the run/replay bookkeeping (the prefill
paths through them are compared with the eager prefill in `test_chunked_prefill_drafter.py`;
the captured graphs run in the CUDA tests of the compiled step)."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime.bucket_graphs import BucketGraphs, length_buckets


@pytest.mark.parametrize("max_len, want", [
    (512, (16, 32, 64, 128, 256, 384, 512)),
    (100, (16, 32, 64, 100)),
    (300, (16, 32, 64, 128, 256, 300)),
    (16, (16,)),
    (1, (1,)),
])
def test_length_buckets_double_then_step_by_128(max_len, want):
    assert length_buckets(max_len) == want


def test_length_buckets_reject_an_empty_range():
    with pytest.raises(ValueError, match="max_len=0"):
        length_buckets(0)


def test_a_length_runs_in_the_smallest_bucket_that_holds_it():
    calls = []
    graphs = BucketGraphs(lambda T: calls.append(T) or torch.full((T,), T), length_buckets(100))
    assert [graphs.bucket(n) for n in (1, 16, 17, 64, 65, 100)] == [16, 16, 32, 64, 100, 100]
    assert graphs.run(32).tolist() == [32] * 32 and calls == [32]  # not captured: the forward itself
    for bad in (0, 101):
        with pytest.raises(ValueError, match=rf"length={bad} is out of range; allowed: \[1, 100\]"):
            graphs.bucket(bad)
    with pytest.raises(ValueError, match="T=33 is not a bucket"):
        graphs.run(33)


@pytest.mark.parametrize("buckets", [(), (32, 16), (16, 16), (0, 4)])
def test_buckets_must_be_ascending_distinct_and_positive(buckets):
    with pytest.raises(ValueError, match="must be ascending"):
        BucketGraphs(lambda T: None, buckets)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_buckets_replay_the_current_inputs():
    """A replay reads what the owner's buffers hold now, not what they held at capture."""
    x = torch.zeros(64, device="cuda")
    graphs = BucketGraphs(lambda T: x[:T] * 2 + 1, length_buckets(64))
    assert graphs.capture(torch.device("cuda")) == 3
    x.copy_(torch.arange(64.0, device="cuda"))
    out = graphs.run(32)
    torch.testing.assert_close(out, torch.arange(32.0, device="cuda") * 2 + 1)
