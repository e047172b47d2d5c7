"""Many requests through one decoder: continuous batching, streaming, per-request draft
budgets, and what happens on failure (a plugin raising, an interrupt, a short KV pool).

Tiny random Llama (fp32, CPU) with a random EAGLE-3 head; every greedy result is compared
token for token with the same prompt run alone.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder

from _mtp_heads import e2e_cpu  # noqa: F401  (fixture)

pytestmark = [
    pytest.mark.usefixtures("e2e_cpu"),
    pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning"),
]
BASE = dict(drafter="eagle3", max_draft_len=3, max_batch_size=4, max_seq_len=96, kv_block_size=4)


@pytest.fixture(scope="module")
def solo_runs(tiny_llama8, tiny_eagle3_head):
    head = tiny_eagle3_head
    target = specdec.load_target(tiny_llama8)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 96, (int(n),), generator=gen).tolist() for n in torch.randint(1, 30, (40,), generator=gen)]
    lengths = [int(n) for n in torch.randint(2, 24, (40,), generator=gen)]
    with pytest.MonkeyPatch.context() as mp:  # module fixtures run before `e2e_cpu`: the same setting here
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "0")
        solo_dec = SpecDecoder.from_pretrained(target, head, SpecConfig(**{**BASE, "max_batch_size": 1}))
        solo = [solo_dec.generate([p], _greedy(n), progress=False)[0].token_ids for p, n in zip(prompts, lengths)]
    return dict(target=target, head=head, prompts=prompts, lengths=lengths, solo=solo)


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True, **kw)


def _decoder(solo_runs, **kw) -> SpecDecoder:
    return SpecDecoder.from_pretrained(solo_runs["target"], solo_runs["head"], SpecConfig(**{**BASE, **kw}))


def _all_blocks_free(dec: SpecDecoder) -> bool:
    cache = dec.engine.runner.cache
    return cache.num_free_blocks == cache.num_blocks and not dec.engine.has_work()


def test_forty_prompts_through_four_slots_equal_their_solo_runs_in_input_order(solo_runs):
    dec = _decoder(solo_runs)
    results = dec.generate(solo_runs["prompts"], [_greedy(n) for n in solo_runs["lengths"]], progress=False)
    assert [r.token_ids for r in results] == solo_runs["solo"]
    assert all(r.stats.finish_reason == "length" for r in results)
    assert _all_blocks_free(dec)


def test_a_request_added_mid_flight_changes_nobody_elses_tokens(solo_runs):
    dec = _decoder(solo_runs)
    engine = dec.engine
    first = [engine.submit(p, _greedy(n)) for p, n in zip(solo_runs["prompts"][:3], solo_runs["lengths"][:3])]
    for _ in range(3):
        engine.run_iteration()
    late = engine.submit(solo_runs["prompts"][3], _greedy(solo_runs["lengths"][3]))
    while engine.has_work():
        engine.run_iteration()
    assert [r.token_ids for r in first + [late]] == solo_runs["solo"][:4]


@pytest.mark.parametrize("sampled", [False, True])
def test_stream_yields_exactly_what_generate_returns(solo_runs, sampled):
    dec = _decoder(solo_runs, verifier="target-only")
    prompts, lengths = solo_runs["prompts"][:6], solo_runs["lengths"][:6]
    params = [_greedy(n, **(dict(temperature=1.0, top_k=8, seed=100 + i) if sampled else {})) for i, n in enumerate(lengths)]
    results = dec.generate(prompts, params)
    expect = [r.token_ids for r in results]
    got = [[] for _ in prompts]
    finishes = [[] for _ in prompts]
    stats = [[] for _ in prompts]
    for delta in dec.stream(prompts, params):
        got[delta.index] += delta.token_ids
        finishes[delta.index].append(delta.finish_reason)
        stats[delta.index].append(delta.stats)
    assert got == expect
    assert all(f[-1] == "length" and all(x is None for x in f[:-1]) for f in finishes)
    # the last delta carries the request's stats: the same steps and acceptance as generate's
    assert all(all(x is None for x in st[:-1]) for st in stats)
    assert [(st[-1].steps, st[-1].accepted_per_step, st[-1].mean_accept_length) for st in stats] == [
        (r.stats.steps, r.stats.accepted_per_step, r.stats.mean_accept_length) for r in results]
    assert _all_blocks_free(dec)


def test_closing_a_stream_early_aborts_its_requests_and_frees_everything(solo_runs):
    dec = _decoder(solo_runs)
    stream = dec.stream(solo_runs["prompts"][:6], _greedy(20))
    next(stream)
    stream.close()
    assert _all_blocks_free(dec)
    assert dec.generate([solo_runs["prompts"][0]], _greedy(solo_runs["lengths"][0]))[0].token_ids == solo_runs["solo"][0]


def test_per_request_budgets_of_zero_two_and_five_each_give_the_target_only_output(solo_runs):
    dec = _decoder(solo_runs, max_draft_len=5)
    prompts, lengths = solo_runs["prompts"][:6], solo_runs["lengths"][:6]
    budgets = [0, 2, 5, None, 0, 2]
    results = dec.generate(prompts, [_greedy(n, num_draft_tokens=k) for n, k in zip(lengths, budgets)])
    assert [r.token_ids for r in results] == solo_runs["solo"][:6]
    for r, k in zip(results, budgets):
        full = 5 if k is None else k
        assert all(a <= full for a in r.stats.accepted_per_step)
        assert len(r.stats.acceptance_by_depth) == full
    assert set(results[0].stats.accepted_per_step) <= {0}


def test_a_request_that_drafts_nothing_skips_the_drafters_prompt_pass_and_stays_exact(solo_runs):
    """Budget 0: the draft head never runs its prompt (its slot stays as `reset_slot` left it,
    root-only trees), alone or in a group prefill beside requests that draft; outputs exact.
    The drafter's prompt rows are counted: exactly the drafting requests' prompt tokens."""
    dec = _decoder(solo_runs, max_draft_len=5)
    drafter = dec.strategies.drafter
    rows: list[int] = []  # prompt rows the drafter ingested, per call
    one, many = drafter.prefill, drafter.prefill_many

    def count_one(slot, next_tokens, *args, **kw):
        rows.append(next_tokens.shape[0])
        return one(slot, next_tokens, *args, **kw)

    def count_many(slots, next_tokens, *args, **kw):
        rows.extend(t.shape[0] for t in next_tokens)
        return many(slots, next_tokens, *args, **kw)

    drafter.prefill, drafter.prefill_many = count_one, count_many
    prompts, lengths = solo_runs["prompts"][:8], solo_runs["lengths"][:8]
    budgets = [0, None, 0, 0, 2, None, 0, 0]
    results = dec.generate(prompts, [_greedy(n, num_draft_tokens=k) for n, k in zip(lengths, budgets)])
    assert [r.token_ids for r in results] == solo_runs["solo"][:8]
    assert all(set(r.stats.accepted_per_step) == {0} for r, k in zip(results, budgets) if k == 0)
    assert sum(rows) == sum(len(p) for p, k in zip(prompts, budgets) if k != 0)
    assert _all_blocks_free(dec)


def test_a_request_that_drafts_nothing_never_holds_back_the_adaptive_deferral(solo_runs):
    """Adaptive steps with every request at budget 0: every plain step is the bare one (no
    drafter, no captured states, no path: the drafter has nothing to keep current) and no
    speculative probe is run (nothing to observe)."""
    dec = _decoder(solo_runs, max_draft_len=3, adaptive=True)
    dec.warmup()  # the step times the rule weighs
    prompts, lengths = solo_runs["prompts"][:4], solo_runs["lengths"][:4]
    results = dec.generate(prompts, [_greedy(n, num_draft_tokens=0) for n in lengths])
    assert [r.token_ids for r in results] == solo_runs["solo"][:4]
    variants = {variant for (_, variant) in dec.engine.step_times.by_bucket}
    rule = dec.engine.adaptive_rule
    assert rule.probes == 0 and rule.decisions[True] == 0, (rule.decisions, rule.probes)
    assert variants == {"bare"}, variants


def test_adaptive_admits_requests_without_the_drafter_when_it_pays_in_no_bucket_and_stays_exact(solo_runs):
    """Planted: every bucket's speculative step 1.5x its plain one and a pool that has seen
    nothing accepted. Requests are admitted without their drafter (no prompt pass: the
    drafter's rows are the explored requests' prompts alone), every plain step is the bare one
    while no admitted request drafts, and the output is the target's. The 5th admission
    explores: beside three undrafted requests, an explorer whose every draft were accepted
    could make a speculative step pay (3 + 4 tokens against 4 x 1.5), so its evidence can come in."""
    from specdec.engine.adaptive import BARE, DEFERRED, PLAIN, SPECULATIVE

    dec = _decoder(solo_runs, max_draft_len=3, adaptive=True)
    dec.warmup()
    rule = dec.engine.adaptive_rule
    for (bucket, variant) in list(rule.costs.warm):
        rule.costs.warm[(bucket, variant)] = 1.5 if variant == SPECULATIVE else 1.0
    # the planted costs hold: live CPU step times follow the machine's load (a busy CI machine
    # once timed the explorer's speculative probe cheap enough that speculating paid after it)
    rule.costs.update = lambda bucket, variant, seconds: None
    for _ in range(100):
        rule.pool.observe(0, 3)
    drafter = dec.strategies.drafter
    rows: list[int] = []
    one, many = drafter.prefill, drafter.prefill_many
    drafter.prefill = lambda slot, t, *a, **k: (rows.append(t.shape[0]), one(slot, t, *a, **k))[1]
    drafter.prefill_many = lambda slots, ts, *a, **k: (rows.extend(t.shape[0] for t in ts), many(slots, ts, *a, **k))[1]
    prompts, lengths = solo_runs["prompts"][:10], solo_runs["lengths"][:10]
    requests = [dec.engine.submit(p, _greedy(n)) for p, n in zip(prompts, lengths)]
    dec.engine.run_until_done(max_steps=500)
    assert [r.token_ids for r in requests] == solo_runs["solo"][:10]
    drafted = [r for r in requests if r.budget != 0]
    assert rule.admissions == {True: len(drafted), False: 10 - len(drafted)} and len(drafted) == 1  # the 5th explores
    assert sum(rows) == sum(len(r.prompt) for r in drafted)
    assert rule.decisions[True] == rule.probes  # speculated only to probe (dearer; the explorer priced at the pool's)
    steps = {variant: n for (_, variant), (n, _, _) in dec.engine.step_times.by_bucket.items()}
    assert steps.get(BARE, 0) + steps.get(DEFERRED, 0) > 4 * steps.get(PLAIN, 0), steps  # the explorer's ingests alone
    assert steps.get(BARE, 0) > 0, steps  # while no running request drafts
    assert _all_blocks_free(dec)


class Boom(RuntimeError):
    pass


def test_a_plugin_failing_mid_batch_fails_that_step_only_and_the_decoder_keeps_working(solo_runs):
    dec = _decoder(solo_runs)
    drafter = dec.strategies.drafter
    calls = {"n": 0}
    real = drafter.propose

    def flaky(state, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise Boom("planted failure in propose")
        return real(state, **kw)

    drafter.propose = flaky
    try:
        with pytest.warns(UserWarning, match=r"request\(s\) failed: .*Boom: planted failure"):
            results = dec.generate(solo_runs["prompts"][:6], [_greedy(n) for n in solo_runs["lengths"][:6]])
    finally:
        drafter.propose = real
    reasons = [r.stats.finish_reason for r in results]
    assert "error" in reasons and all(x in ("error", "length") for x in reasons)
    for r, solo in zip(results, solo_runs["solo"]):
        assert r.token_ids == solo[: len(r.token_ids)]  # what a failed request got so far stays exact
        if r.stats.finish_reason == "error":
            assert "Boom: planted failure in propose" in r.stats.error
        else:
            assert r.token_ids == solo
    assert _all_blocks_free(dec)
    out = dec.generate(solo_runs["prompts"][:4], [_greedy(n) for n in solo_runs["lengths"][:4]])
    assert [r.token_ids for r in out] == solo_runs["solo"][:4]


def test_a_failing_prefill_fails_only_its_request(solo_runs):
    dec = _decoder(solo_runs)
    drafter = dec.strategies.drafter
    real = drafter.prefill
    bad = solo_runs["prompts"][2]

    def is_bad(next_tokens):
        return next_tokens.shape[0] == len(bad) and next_tokens[:-1].tolist() == bad[1:]

    def picky(slot, next_tokens, hidden, start=0):
        if is_bad(next_tokens):
            raise Boom("this prompt's prefill fails")
        return real(slot, next_tokens, hidden, start)

    def picky_group(slots, next_tokens, hidden, starts):  # a grouped prefill holding it fails as a whole
        if any(is_bad(t) for t in next_tokens):
            raise Boom("a group with this prompt fails")
        return real_group(slots, next_tokens, hidden, starts)

    real_group = getattr(drafter, "prefill_many", None)
    drafter.prefill = picky
    if real_group is not None:
        drafter.prefill_many = picky_group
    try:
        with pytest.warns(UserWarning, match=r"prompt 2: Boom: this prompt's prefill fails"):
            results = dec.generate(solo_runs["prompts"][:5], [_greedy(n) for n in solo_runs["lengths"][:5]])
    finally:
        drafter.prefill = real
        if real_group is not None:
            drafter.prefill_many = real_group
    assert [r.stats.finish_reason for r in results] == ["length", "length", "error", "length", "length"]
    assert [r.token_ids for i, r in enumerate(results) if i != 2] == [s for i, s in enumerate(solo_runs["solo"][:5]) if i != 2]
    assert _all_blocks_free(dec)


def test_an_interrupt_mid_generation_releases_everything_and_the_next_call_works(solo_runs):
    dec = _decoder(solo_runs)

    class Interrupt:
        steps = 0

        def on_step(self, engine, lengths):
            self.steps += 1
            if self.steps == 4:
                raise KeyboardInterrupt

    observer = Interrupt()
    dec.add_observer(observer)
    with pytest.raises(KeyboardInterrupt):
        dec.generate(solo_runs["prompts"][:8], [_greedy(n) for n in solo_runs["lengths"][:8]])
    dec.engine.observers.remove(observer)
    assert _all_blocks_free(dec) and dec.engine.free_slots() == [0, 1, 2, 3]
    out = dec.generate(solo_runs["prompts"][:8], [_greedy(n) for n in solo_runs["lengths"][:8]])
    assert [r.token_ids for r in out] == solo_runs["solo"][:8]


def test_an_undersized_kv_pool_preempts_and_every_request_still_gets_its_solo_output(solo_runs):
    # 4 slots but blocks for ~1.5 long requests: admission waits and running requests get preempted
    dec = _decoder(solo_runs, num_kv_blocks=14)
    prompts = [p for p in solo_runs["prompts"] if len(p) > 12][:8]
    idx = [solo_runs["prompts"].index(p) for p in prompts]
    results = dec.generate(prompts, [_greedy(solo_runs["lengths"][i]) for i in idx])
    assert [r.token_ids for r in results] == [solo_runs["solo"][i] for i in idx]
    assert sum(r.stats.preemptions for r in results) > 0
    assert _all_blocks_free(dec)


def test_a_request_larger_than_the_whole_pool_is_refused_before_any_work(solo_runs):
    dec = _decoder(solo_runs, num_kv_blocks=4)
    with pytest.raises(specdec.ConfigError, match=r"prompt 1: the request needs \d+ KV positions but the whole pool holds 16"):
        dec.generate([[1, 2], [3] * 20], _greedy(8))
    assert _all_blocks_free(dec)


def test_incremental_detokenization_never_splits_a_character():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from specdec.entrypoints.streaming import IncrementalDetokenizer

    corpus = ["héllo wörld, ça va? 世界你好 🎉🎉 naïve café", "plain ascii text with spaces", "日本語のテキスト"] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=300, min_frequency=1, show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    text = "ça va? 世界 🎉 naïve 日本語 done"
    ids = tok(text)["input_ids"]
    for step in (1, 2, 3):
        detok = IncrementalDetokenizer(tok)
        pieces = [detok.push(ids[i : i + step], final=i + step >= len(ids)) for i in range(0, len(ids), step)]
        assert "".join(pieces) == tok.decode(ids)
        assert all("\ufffd" not in p for p in pieces)
