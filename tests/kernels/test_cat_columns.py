"""`ops.columns.cat_columns` equals `torch.cat(parts, 1)` (eager and compiled), batch-1 parts
broadcast, and bad parts are refused by shape."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.ops.columns import cat_columns


@st.composite
def column_parts(draw):
    B = draw(st.integers(1, 4))
    widths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    dtype = draw(st.sampled_from([torch.int64, torch.float32]))
    parts = [torch.randint(-50, 50, (B, w), generator=gen).to(dtype) for w in widths]
    return [p[:1] if draw(st.booleans()) else p for p in parts], B  # some parts broadcast over the batch


@given(case=column_parts())
def test_cat_columns_equals_torch_cat(case):
    parts, _ = case
    B = max(p.shape[0] for p in parts)  # the widest batch; batch-1 parts broadcast
    want = torch.cat([p.expand(B, -1) for p in parts], 1)
    assert torch.equal(cat_columns(parts), want)


@settings(max_examples=5, deadline=None)
@given(case=column_parts())
def test_cat_columns_compiled_equals_torch_cat(case):
    parts, _ = case
    B = max(p.shape[0] for p in parts)
    want = torch.cat([p.expand(B, -1) for p in parts], 1)
    got = torch.compile(cat_columns, dynamic=True, fullgraph=True)(parts)
    assert torch.equal(got, want)


@pytest.mark.parametrize("parts, match", [([], "at least one part"), ([torch.zeros(2, 0)], r"width >= 1, got shapes \[\(2, 0\)\]"),
                                          ([torch.zeros(3)], r"2-D parts")])
def test_bad_parts_are_refused_by_shape(parts, match):
    with pytest.raises(ValueError, match=match):
        cat_columns(parts)
