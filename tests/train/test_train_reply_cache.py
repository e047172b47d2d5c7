"""The prompts stage's reply cache: replies saved chunk by chunk, a deadline that stops the
stage with them kept, and a resumed stage that builds the same prompts as an uninterrupted one."""

import argparse
import itertools
import zlib

import pytest

from specdec.train import mix
from specdec.train.reply_cache import PromptsUnfinished, ReplyCache, cached_generate

from _train_tiny import one_thread


class CountingGenerate:
    """A deterministic `Generate` (the reply depends on the whole conversation) that records its batches."""

    def __init__(self):
        self.batches: list[int] = []

    def __call__(self, convs):
        self.batches.append(len(convs))
        return [f"Please write request {zlib.crc32(repr(c).encode()) % 10**6} about it" for c in convs]


def _convs(n):
    return [[{"role": "user", "content": f"question {i}"}] for i in range(n)]


def test_replies_are_saved_per_chunk_and_read_back(tmp_path):
    gen = CountingGenerate()
    cache = ReplyCache(tmp_path / "r.jsonl")
    run = cached_generate(gen, cache, "greedy", chunk=4)
    convs = _convs(10) + _convs(3)  # three repeats: generated once
    first = run(convs)
    assert gen.batches == [4, 4, 2] and first == gen(convs)[:13]
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 10
    again = CountingGenerate()
    assert cached_generate(again, ReplyCache(tmp_path / "r.jsonl"), "greedy", chunk=4)(convs) == first
    assert again.batches == []  # all from the file
    assert cached_generate(again, ReplyCache(tmp_path / "r.jsonl"), "sampled", chunk=4)(convs[:2]) == first[:2]
    assert again.batches == [2]  # another label is another generator: not reused


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "r.jsonl"
    cache = ReplyCache(path)
    cached_generate(CountingGenerate(), cache, "greedy", chunk=8)(_convs(3))
    with path.open("a") as f:
        f.write('{"key": "abc", "rep')  # a call killed mid-write
    assert len(ReplyCache(path)) == 3


def test_the_deadline_stops_between_chunks_keeping_what_was_written(tmp_path):
    ticks = itertools.count()
    cache = ReplyCache(tmp_path / "r.jsonl")
    gen = CountingGenerate()
    run = cached_generate(gen, cache, "greedy", chunk=3, deadline=2, clock=lambda: next(ticks))
    with pytest.raises(PromptsUnfinished, match=r"4 of 10 replies"):
        run(_convs(10))
    assert gen.batches == [3, 3] and len(ReplyCache(tmp_path / "r.jsonl")) == 6
    rest = CountingGenerate()
    out = cached_generate(rest, ReplyCache(tmp_path / "r.jsonl"), "greedy", chunk=3)(_convs(10))
    assert rest.batches == [3, 1] and out == CountingGenerate()(_convs(10))
    with pytest.raises(ValueError, match="chunk=0"):
        cached_generate(gen, cache, "greedy", chunk=0)


def test_a_resumed_mix_is_the_uninterrupted_one(tmp_path):
    """Self-instruct and 2-3-turn conversations, stopped by the deadline after each chunk in turn
    and resumed, give the same prompts as one uninterrupted stage (each turn keyed by the replies
    before it), asking the target no conversation twice."""
    cfg = mix.MixConfig(source=0.0, instruct=0.2, math=0.0, header=0.0, self_instruct=0.4, multi_turn=0.4)

    def stage(cache, deadline=None, clock=None):
        gens = CountingGenerate(), CountingGenerate()
        kw = {"chunk": 5, "deadline": deadline} | ({"clock": clock} if clock else {})
        g = cached_generate(gens[0], cache, "greedy", **kw)
        s = cached_generate(gens[1], cache, "sampled", **kw)
        return mix.sample_mix(40, 0, config=cfg, generate=g, sample=s), sum(gens[0].batches) + sum(gens[1].batches)

    whole, asked_whole = stage(ReplyCache(tmp_path / "whole.jsonl"))
    asked, stops = 0, 0
    while True:
        ticks = itertools.count()
        try:
            got, n = stage(ReplyCache(tmp_path / "parts.jsonl"), deadline=1, clock=lambda: next(ticks))
            asked += n
            break
        except PromptsUnfinished:
            stops += 1
            assert stops < 50
    assert stops >= 3 and got == whole
    assert len(ReplyCache(tmp_path / "parts.jsonl")) == len(ReplyCache(tmp_path / "whole.jsonl")) == asked_whole
    assert any(p.kind == "multi-turn" for p in whole) and any(p.source.endswith("|self") for p in whole)


def test_the_pipeline_exits_3_at_the_prompt_deadline_and_goes_on(tmp_path, monkeypatch, capsys):
    from _chat_tokenizer import save_chat_tokenizer
    from _tiny_models import make_checkpoint

    from specdec.models import load_target
    from specdec.train.pipeline import EXIT_PROMPTS_UNFINISHED, Phases, load_or_make_data

    args = argparse.Namespace(target=str(tmp_path), num_prompts=8, max_new_tokens=3, max_prompt_tokens=200, temperature=0.0,
                              seed=0, roots="stdlib", data_mix="diverse", gen_batch_size=4, gen_minutes=None,
                              gen_cuda_graph="off", regenerate=False, prompt_minutes=0.0,
                              mix_shares="source=0.25,instruct=0.25,self_instruct=0.25,multi_turn=0.25")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' torch references (kernels: own suites)
    work = tmp_path / "work"
    with one_thread():
        make_checkpoint("llama", tmp_path, num_hidden_layers=1, vocab_size=96)
        save_chat_tokenizer(tmp_path)
        target = load_target(tmp_path)
        with pytest.raises(SystemExit) as stop:
            load_or_make_data(args, target, work, Phases())
        assert stop.value.code == EXIT_PROMPTS_UNFINISHED
        assert "--prompt-minutes 0.0" in capsys.readouterr().out and not (work / "prompts.jsonl").exists()
        args.prompt_minutes = None
        data = load_or_make_data(args, target, work, Phases())
    assert (work / "prompts.jsonl").is_file() and len(ReplyCache(work / "prompt_replies.jsonl")) > 0
    assert "multi-turn" in data.kinds
