"""Counter-based draws (`specdec.ops.random`): every bit of the seed and of the counter counts,
the streams are independent, the values are uniform, and a row's draws do not depend on the
rows beside it. End to end: seeds that differ only above 32 bits sample differently, and
the largest allowed seed (2^63 - 1) works while 2^63 is refused by name.

Uniformity: 2^16 draws in 64 equal bins; the chi-square statistic (63 degrees of freedom)
stays under 110 (p ~ 2e-4 for a true uniform); a hash that dropped the high seed word or
reused a lane fails the distinctness checks, one that lost low bits fails the bins.
"""

from __future__ import annotations

import pytest
import torch

from specdec import ConfigError, SamplingParams, SpecConfig, SpecDecoder
from specdec.ops.random import STREAM_DRAFT, STREAM_FIRST_TOKEN, STREAM_VERIFY, counter_uniforms, hash32

from _mtp_heads import e2e_cpu  # noqa: F401  (a fixture)
from _tiny_models import make_checkpoint

I64 = torch.int64
TOP = 2**63 - 1


def draws(seeds, counters, num=8, stream=STREAM_VERIFY) -> torch.Tensor:
    return counter_uniforms(torch.tensor(seeds, dtype=I64), torch.tensor(counters, dtype=I64), num, stream)


def test_seeds_that_differ_only_above_32_bits_draw_differently():
    base = 12345
    seeds = [base, base + 2**32, base + 2**40, base + 2**62, TOP, TOP - 2**32]
    u = draws(seeds, [7] * len(seeds))
    rows = {tuple(r.tolist()) for r in u}
    assert len(rows) == len(seeds)


def test_counters_that_differ_only_above_32_bits_draw_differently():
    u = draws([3, 3, 3], [5, 5 + 2**32, 5 + 2**50])
    assert len({tuple(r.tolist()) for r in u}) == 3


def test_the_streams_are_separate_and_the_lanes_are_distinct():
    seeds, counters = [99], [4]
    streams = [draws(seeds, counters, 16, s)[0] for s in (STREAM_VERIFY, STREAM_FIRST_TOKEN, STREAM_DRAFT)]
    assert len({tuple(s.tolist()) for s in streams}) == 3
    lanes = draws(seeds, counters, 4096)[0]
    assert lanes.unique().numel() == 4096


def test_draws_are_a_pure_function_of_their_coordinates_whatever_the_batch():
    alone = draws([TOP], [123], 32)
    in_batch = draws([1, TOP, 2**40], [5, 123, 9], 32)
    assert torch.equal(alone[0], in_batch[1])
    assert torch.equal(draws([TOP], [123], 32), alone)


def test_draws_are_uniform_on_0_1():
    seeds = torch.arange(256, dtype=I64) * (2**33 + 7)  # seeds with high words, all different
    counters = torch.arange(256, dtype=I64) + 2**32
    u = counter_uniforms(seeds, counters, 256, STREAM_VERIFY).flatten()  # 65536 draws
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u.float(), bins=64, min=0.0, max=1.0)
    expected = u.numel() / 64
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 110, chi2
    # the 53 bits are used: no two of 65536 draws collide (a 32-bit value would, ~40% of the time)
    assert u.unique().numel() == u.numel()


def test_hash32_stays_in_32_bits_and_mixes():
    x = torch.tensor([0, 1, 2, 2**31, 2**32 - 1], dtype=I64)
    h = hash32(x)
    assert bool(((h >= 0) & (h < 2**32)).all()) and h.unique().numel() == x.numel()


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rand_target")
    make_checkpoint("llama", folder, num_hidden_layers=2, seed=5)
    return folder


@pytest.mark.usefixtures("e2e_cpu")
def test_seeds_above_32_bits_through_generate(tiny):
    dec = SpecDecoder.from_pretrained(tiny, None, SpecConfig(verifier="target-only", max_batch_size=3, max_seq_len=64))
    prompt = [5, 17, 33, 8]

    def sample(seed):
        params = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=24, ignore_eos=True)
        return dec.generate([prompt], params)[0].token_ids

    low = sample(77)
    assert sample(77) == low  # reproducible
    assert sample(77 + 2**32) != low  # the high word of the seed counts
    top = sample(TOP)
    assert sample(TOP) == top and top != sample(TOP - 2**32)
    batch = dec.generate([prompt] * 3, [SamplingParams(temperature=1.0, seed=s, max_new_tokens=24, ignore_eos=True)
                                        for s in (1, TOP, 77 + 2**32)])
    assert batch[1].token_ids == top  # the same tokens alone and in a batch


@pytest.mark.parametrize("seed, ok", [(0, True), (TOP, True), (-1, False), (2**63, False)])
def test_the_seed_range_is_zero_to_two_to_the_63_minus_one(seed, ok):
    if ok:
        assert SamplingParams(seed=seed).seed == seed
    else:
        with pytest.raises(ConfigError, match=r"seed=.* is out of range; allowed: \[0, 9223372036854775807\]"):
            SamplingParams(seed=seed)
