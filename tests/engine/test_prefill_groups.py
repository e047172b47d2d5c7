"""Grouped prefill: the next chunks of several prefilling requests run as one target forward
(`ModelRunner.prefill_many`, padded to the longest), which must change nothing but the
number of forwards: the same tokens (greedy and seeded sampling, whose first token is drawn
for the whole group at once), the same drafter proposals and acceptance as one forward per
request, groups that respect `prefill_chunk_size` (padded), and a group whose forward fails
retried request by request, so only a request that fails alone fails.
(test_chunked_prefill_drafter.py compares the drafter's trees across chunk sizes, where
chunk 512 groups the prompts and 5 or 1 does not.)"""

from __future__ import annotations

import pytest

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder

from _eagle3_heads import saved_tiny_head
from _mtp_heads import e2e_cpu, random_mtp  # noqa: F401  (e2e_cpu: a fixture)
from _tiny_models import make_checkpoint

pytestmark = [pytest.mark.usefixtures("e2e_cpu"),
              pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning")]
PROMPTS = [[3, 14, 15, 92, 65, 35, 89], [9] * 9 + [40, 9, 9, 40, 9, 7, 7, 8, 21, 22], [71, 5], [60, 61, 62, 63, 64, 65],
           list(range(10, 40)), [2, 4, 8, 16, 32, 64]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("group_target")
    make_checkpoint("llama", folder, num_hidden_layers=4, seed=5)
    head = tmp_path_factory.mktemp("group_head")
    saved_tiny_head(head, seed=2, capture_layers=(0, 1, 2), std=0.3)
    return dict(target=specdec.load_target(folder), eagle3=head, mtp=random_mtp(seed=0), none=None)


def _decoder(models, drafter: str, grouped: bool, **cfg) -> tuple[SpecDecoder, list]:
    config = SpecConfig(**{**dict(drafter=drafter, max_draft_len=3, max_batch_size=4, max_seq_len=96, kv_block_size=4,
                                  prefill_chunk_size=24), **cfg})
    dec = SpecDecoder.from_pretrained(models["target"], models[drafter], config)
    engine, groups = dec.engine, []
    inner_group = engine._prefill_group

    def group(prefilling):
        chosen = inner_group(prefilling) if grouped else prefilling[:1]
        groups.append(len(chosen))
        return chosen

    engine._prefill_group = group
    return dec, groups


def _generate(dec, params):
    results = dec.generate(PROMPTS, params)
    return [r.token_ids for r in results], [r.stats.accepted_per_step for r in results]


@pytest.mark.parametrize("drafter", ["none", "eagle3", "mtp"])
def test_grouped_prefill_gives_what_one_forward_per_request_gives(models, drafter):
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    alone, alone_groups = _decoder(models, drafter, grouped=False)
    together, groups = _decoder(models, drafter, grouped=True)
    assert _generate(together, greedy) == _generate(alone, greedy)
    assert max(groups) >= 3 and set(alone_groups) == {1}  # prompts of 2-30 tokens, 24 padded tokens a forward


def test_seeded_sampling_draws_the_same_first_token_in_a_group(models):
    params = [SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.95, seed=1000 + i, ignore_eos=True)
              for i in range(len(PROMPTS))]
    alone, _ = _decoder(models, "eagle3", grouped=False, verifier="speculative")
    together, groups = _decoder(models, "eagle3", grouped=True, verifier="speculative")
    assert [r.token_ids for r in together.generate(PROMPTS, params)] == [r.token_ids for r in alone.generate(PROMPTS, params)]
    assert max(groups) >= 3


def test_groups_fit_the_chunk_budget_padded_and_take_the_oldest_first(models):
    dec, _ = _decoder(models, "eagle3", grouped=True)
    engine, shapes = dec.engine, []
    inner = engine.runner.prefill_many

    def record(slots, chunks, starts):
        shapes.append((len(chunks), max(c.shape[0] for c in chunks), list(slots)))
        return inner(slots, chunks, starts)

    engine.runner.prefill_many = record
    dec.generate(PROMPTS, SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert shapes and all(n * width <= 24 for n, width, _ in shapes)
    # 4 slots: prompts 0-3 (7, 19, 2, 6 tokens) are admitted first; 19 does not fit beside 7
    # (2 x 19 > 24), so the oldest (7) goes with the younger 2 and 6, padded to 7; 19 goes next
    assert shapes[0] == (3, 7, [0, 2, 3])


def test_with_prefill_buckets_a_group_of_fresh_prompts_fits_one_bucket(models):
    """With padded (rows, length) prefill buckets (graphs on; here run without capture) a group
    must also fit a bucket, or its forward runs eagerly. Chunk budget 64: buckets rows 1, 2, 4
    x lengths 16, 32, 64 within 64 tokens. Prompts 7, 19, 2, 6: by tokens alone 7, 19 and 2
    would share a forward (3 x 19 <= 64) padded to 4 x 32, no bucket; with buckets 7 and 19
    go together (2 x 32), then 2 and 6 (2 x 16). The tokens stay those of one forward per request."""
    from specdec.engine import use_prefill_buckets

    reference, _ = _decoder(models, "eagle3", grouped=False, prefill_chunk_size=64)
    dec, _ = _decoder(models, "eagle3", grouped=True, prefill_chunk_size=64)
    engine = dec.engine
    use_prefill_buckets(engine.runner, engine.strategies.drafter, engine.config, capture=False)
    buckets, groups = engine.runner.prefill_buckets, []
    inner = engine.runner.prefill_many

    def record(slots, chunks, starts):
        groups.append(([c.shape[0] for c in chunks], list(starts)))
        return inner(slots, chunks, starts)

    engine.runner.prefill_many = record
    greedy = SamplingParams(max_new_tokens=10, ignore_eos=True)
    assert _generate(dec, greedy) == _generate(reference, greedy)
    assert groups[0] == ([7, 19], [0, 0]) and groups[1] == ([2, 6], [0, 0])
    assert all(buckets.key_for(lengths, starts) is not None for lengths, starts in groups if len(lengths) > 1)
    assert buckets.bucket(3, 19) is None  # the group by tokens alone


def test_a_failing_group_forward_is_retried_request_by_request(models):
    reference, _ = _decoder(models, "eagle3", grouped=False)
    dec, _ = _decoder(models, "eagle3", grouped=True)
    inner, calls = dec.engine.runner.prefill_many, []

    def flaky(slots, chunks, starts):
        calls.append(len(chunks))
        if len(calls) == 1:
            raise RuntimeError("planted: this group's forward fails once")
        return inner(slots, chunks, starts)

    dec.engine.runner.prefill_many = flaky
    greedy = SamplingParams(max_new_tokens=10, ignore_eos=True)
    results = dec.generate(PROMPTS, greedy)
    assert all(r.stats.finish_reason == "length" for r in results)  # nobody failed: the retry ran each alone
    assert [r.token_ids for r in results] == _generate(reference, greedy)[0]
    assert len(calls) >= 2


@pytest.mark.parametrize("drafter", ["eagle3", "mtp"])
def test_the_drafter_ingests_a_group_as_it_ingests_each_chunk(models, drafter):
    """`HeadDrafter.prefill_many` (one padded forward) leaves each slot's context state and
    root logits where `prefill` slot by slot leaves them (chunks at 0 and past 0)."""
    import torch

    grouped, _ = _decoder(models, drafter, grouped=True)
    single, _ = _decoder(models, drafter, grouped=True)
    width = grouped.strategies.drafter.hidden_width
    gen = torch.Generator().manual_seed(0)
    chunks = [(0, 0, 7), (1, 4, 3), (2, 0, 12)]  # (slot, start, tokens)
    for dec in (grouped, single):  # the draft KV lives on the target's blocks: back the positions
        for slot, _, _ in chunks:
            dec.engine.runner.reserve(slot, 16)
    for slot, start, n in chunks:  # both hold the same earlier chunk where start > 0
        if start:
            earlier = (torch.randint(0, 90, (start,), generator=gen), torch.randn(start, width, generator=gen))
            for dec in (grouped, single):
                dec.strategies.drafter.prefill(slot, earlier[0], earlier[1], 0)
    tokens = [torch.randint(0, 90, (n,), generator=gen) for _, _, n in chunks]
    hidden = [torch.randn(n, width, generator=gen) for _, _, n in chunks]
    grouped.strategies.drafter.prefill_many([c[0] for c in chunks], tokens, hidden, [c[1] for c in chunks])
    for (slot, start, _), t, h in zip(chunks, tokens, hidden):
        single.strategies.drafter.prefill(slot, t, h, start)
    g, s = grouped.strategies.drafter, single.strategies.drafter
    # fp32 rounding differs between a padded [3, T] forward and [1, T] ones (BLAS blocking)
    torch.testing.assert_close(g.ctx_hidden[:3], s.ctx_hidden[:3], rtol=1e-3, atol=2e-4)
    torch.testing.assert_close(g.root_logits[:3], s.root_logits[:3], rtol=1e-3, atol=2e-4)
    assert g.live[:3].tolist() == [True, True, True]


def _iteration_log(engine):
    """(running, prefilling, prefill forwards) after each run_iteration of `engine`."""
    log, forwards = [], [0]
    inner = engine.runner.prefill_many

    def counted(*args, **kwargs):
        forwards[0] += 1
        return inner(*args, **kwargs)

    engine.runner.prefill_many = counted
    while engine.has_work():
        forwards[0] = 0
        engine.run_iteration()
        log.append((len(engine.running()), len(engine._prefilling()), forwards[0]))
    return log


@pytest.mark.parametrize("drafter", ["none", "eagle3"])
def test_prefill_goes_on_while_fewer_requests_run_than_wait_then_one_forward_per_step(models, drafter):
    """Prompts of 13 tokens, one per forward (2 x 13 > 24), and a prefill budget of one token
    per iteration: a batch of 8 fresh requests prefills until as many run as wait (4 and 4)
    before its first step, not one forward per step with 1, 2, 3 ... running; from then on
    one forward per iteration, so running requests wait at most one chunk. Greedy output is
    what it was."""
    prompts = [[5 + i] + list(range(20, 32)) for i in range(8)]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    dec, _ = _decoder(models, drafter, grouped=True, max_batch_size=8, prefill_tokens_per_step=1)
    engine = dec.engine
    for p in prompts:
        engine.submit(p, params)
    log = _iteration_log(engine)
    assert log[0] == (4, 4, 4)
    assert all(forwards <= 1 for _, _, forwards in log[1:]), log
    alone, _ = _decoder(models, drafter, grouped=False, max_batch_size=8)
    assert [r.token_ids for r in dec.generate(prompts, params)] == [r.token_ids for r in alone.generate(prompts, params)]


@pytest.mark.parametrize("budget, first, most", [(26, (4, 4, 4), 2), (39, (4, 4, 4), 3), (10_000, (8, 0, 8), 0)])
def test_an_iteration_prefills_up_to_its_token_budget_before_its_step(models, budget, first, most):
    """The same 8 requests of 13 tokens with `prefill_tokens_per_step` 26, 39 and 10000: the
    first iteration prefills until as many run as wait and its budget is spent (4 forwards,
    52 tokens, for 26 and 39; all 8 for 10000), later ones up to budget / 13 forwards (2, 3),
    where one forward per iteration made the last request wait 4 steps. Greedy output is what it was."""
    prompts = [[5 + i] + list(range(20, 32)) for i in range(8)]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    dec, _ = _decoder(models, "eagle3", grouped=True, max_batch_size=8, prefill_tokens_per_step=budget)
    engine = dec.engine
    for p in prompts:
        engine.submit(p, params)
    log = _iteration_log(engine)
    assert log[0] == first, log
    assert all(forwards <= max(most, 1) for _, _, forwards in log[1:]), log
    assert max(forwards for _, _, forwards in log[1:]) == most, log
    alone, _ = _decoder(models, "eagle3", grouped=False, max_batch_size=8)
    assert [r.token_ids for r in dec.generate(prompts, params)] == [r.token_ids for r in alone.generate(prompts, params)]
