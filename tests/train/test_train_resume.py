"""Self-distillation that resumes and fills small families: per-prompt temperatures (greedy
answers plus sampled variants of a repeated prompt), a generation killed mid-way continuing
where it stopped, and ``--continue-generation`` answering what a deadline left unanswered."""

import argparse
from collections import Counter
from dataclasses import replace

import pytest
import torch
from _train_tiny import one_thread, reference_ops

from specdec.train import distill, mix
from specdec.train.distill import (
    DistillData,
    _pick,
    build_distill_data,
    generate_responses,
)
from specdec.train.prompts import Prompt


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread(), reference_ops():
        yield


def _prompts(n: int, variant_every: int = 0) -> list[Prompt]:
    return [Prompt("code", f"t:{i}", f"prompt {i}", False, variant=int(variant_every > 0 and i % variant_every == 1))
            for i in range(n)]


def _encode(prompt, tokenizer, vocab_size):
    """Token ids from the prompt's number (no tokenizer needed): 3..9 tokens, distinct per prompt."""
    i = int(prompt.text.split()[-1])
    return [(7 * i + k) % 90 + 3 for k in range(3 + i % 7)]


# --------------------------------------------------------------------------- per-prompt temperature
def test_each_row_is_drawn_at_its_own_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 3)  # [3, 4]
    temps = torch.tensor([0.0, 1.0, 0.5])
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([_pick(logits, temps, gen) for _ in range(4000)])  # [4000, 3]
    assert (draws[:, 0] == 0).all()  # temperature 0: the argmax, always
    for row, t in ((1, 1.0), (2, 0.5)):
        want = torch.softmax(logits[0] / t, -1)
        got = torch.bincount(draws[:, row], minlength=4).float() / 4000
        # 4000 draws: the standard error of a frequency is at most 0.008; 0.03 is > 3.5 of them
        assert (got - want).abs().max() < 0.03, (row, got, want)
    assert (_pick(logits, None, None) == 0).all()


def test_sampled_rows_leave_the_greedy_rows_of_their_batch_unchanged(train_target):
    prompts = [[5, 6, 7, 8], [3, 1, 4], [40, 41], [2] * 6]
    greedy = generate_responses(train_target.model, prompts, max_new_tokens=8, batch_size=4, eos_token_ids=(), progress=False)
    mixed = generate_responses(train_target.model, prompts, max_new_tokens=8, batch_size=4, eos_token_ids=(), progress=False,
                               temperature=[0.0, 1.0, 0.0, 1.0], seed=3)
    assert mixed[0] == greedy[0] and mixed[2] == greedy[2]
    assert mixed[1] != greedy[1] and mixed[3] != greedy[3]  # a random tiny model: 8 draws never all its argmax
    with pytest.raises(ValueError, match="3 temperatures for 4 prompts"):
        generate_responses(train_target.model, prompts, max_new_tokens=2, batch_size=4, eos_token_ids=(), temperature=[0.0] * 3)
    with pytest.raises(ValueError, match=r"temperature=-1\.0 must be >= 0"):
        generate_responses(train_target.model, prompts, max_new_tokens=2, batch_size=4, eos_token_ids=(), temperature=-1.0)


def test_variants_are_sampled_and_refused_at_temperature_zero(train_target):
    prompts = _prompts(6, variant_every=2)  # prompts 1, 3, 5 are variants
    data = build_distill_data(train_target, prompts, max_new_tokens=6, batch_size=8, encode=_encode, progress=False,
                              variant_temperature=1.0)
    assert data.meta["variants"] == 3 and data.meta["variant_temperature"] == 1.0 and len(data) == 6
    with pytest.raises(ValueError, match=r"variant_temperature=0\.0 must be > 0"):
        build_distill_data(train_target, prompts, max_new_tokens=6, batch_size=8, encode=_encode, progress=False,
                           variant_temperature=0.0)


# --------------------------------------------------------------------------- resuming
class Killed(Exception):
    pass


def test_a_killed_generation_resumes_where_it_stopped(train_target, tmp_path, monkeypatch):
    prompts, path = _prompts(10), tmp_path / "responses.pt"
    whole = build_distill_data(train_target, prompts, max_new_tokens=6, batch_size=4, encode=_encode, progress=False)
    monkeypatch.setattr(distill, "SAVE_EVERY_S", 0.0)
    real = distill.generate_responses
    asked = []

    def killed_after_one_batch(model, ps, **kw):
        save = kw["on_batch"]

        def on_batch(responses):
            save(responses)
            raise Killed  # the machine went away after the first batch was saved

        return real(model, ps, **{**kw, "on_batch": on_batch})

    monkeypatch.setattr(distill, "generate_responses", killed_after_one_batch)
    with pytest.raises(Killed):
        build_distill_data(train_target, prompts, max_new_tokens=6, batch_size=4, encode=_encode, progress=False,
                           resume_path=path)
    saved = torch.load(path, weights_only=True)["responses"]
    assert sum(r is not None for r in saved) == 4  # one batch

    def counting(model, ps, **kw):
        asked.append(len(ps))
        return real(model, ps, **kw)

    monkeypatch.setattr(distill, "generate_responses", counting)
    resumed = build_distill_data(train_target, prompts, max_new_tokens=6, batch_size=4, encode=_encode, progress=False,
                                 resume_path=path)
    assert asked == [6] and resumed.meta["resumed"] == 4
    assert resumed.tokens.tolist() == whole.tokens.tolist()  # greedy: the same data as one uninterrupted call
    assert 0 < resumed.meta["new_response_tokens"] < resumed.meta["response_tokens"] == whole.meta["new_response_tokens"]
    again = build_distill_data(train_target, prompts, max_new_tokens=6, batch_size=4, encode=_encode, progress=False,
                               resume_path=path)
    assert asked == [6] and again.meta["resumed"] == 10  # everything answered: nothing generated
    assert again.meta["new_response_tokens"] == 0
    other = build_distill_data(train_target, prompts, max_new_tokens=5, batch_size=4, encode=_encode, progress=False,
                               resume_path=path)  # other settings: another generation, started over
    assert asked == [6, 10] and other.meta["resumed"] == 0


def _args(tmp_path, **kw) -> argparse.Namespace:
    base = dict(target=str(tmp_path), num_prompts=10, max_new_tokens=4, max_prompt_tokens=200, temperature=0.0,
                seed=0, roots="stdlib", data_mix="source", gen_batch_size=4, gen_minutes=None, gen_cuda_graph="off",
                regenerate=False, continue_generation=False)
    return argparse.Namespace(**{**base, **kw})


def test_continue_generation_answers_what_the_deadline_left(tmp_path, monkeypatch, capsys):
    from _chat_tokenizer import save_chat_tokenizer
    from _tiny_models import make_checkpoint

    from specdec.models import load_target
    from specdec.train import prompts as prompts_mod
    from specdec.train.pipeline import Phases, load_or_make_data

    make_checkpoint("llama", tmp_path, num_hidden_layers=2, vocab_size=96)
    save_chat_tokenizer(tmp_path)
    tgt, work = load_target(tmp_path), tmp_path / "work"
    real = distill.generate_responses

    def deadline_after_four(model, ps, **kw):  # as a --gen-minutes deadline after the first batch
        kw["temperature"] = kw["temperature"][:4]
        return real(model, ps[:4], **kw) + [None] * (len(ps) - 4)

    monkeypatch.setattr(distill, "generate_responses", deadline_after_four)
    first = load_or_make_data(_args(tmp_path), tgt, work, Phases())
    assert first.meta["prompts_not_reached"] > 0 and len(first) == 4
    (work / "checkpoint").mkdir()  # a training made on the 4 sequences
    monkeypatch.setattr(distill, "generate_responses", real)
    assert len(load_or_make_data(_args(tmp_path), tgt, work, Phases())) == 4  # without the flag: reused as is

    def no_new_prompts(*a, **k):
        raise AssertionError("the prompts are read from <work>/prompts.jsonl")

    monkeypatch.setattr(prompts_mod, "sample_prompts", no_new_prompts)
    more = load_or_make_data(_args(tmp_path, continue_generation=True), tgt, work, Phases())
    assert more.meta["prompts_not_reached"] == 0 and more.meta["resumed"] == 4 and len(more) > 4
    assert len(more) == more.meta["prompts_asked"] - more.meta["prompts_too_long"]
    assert (work / "checkpoint.stale").is_dir() and not (work / "checkpoint").exists()
    assert "moved to" in capsys.readouterr().out


def test_reuse_data_generates_nothing_and_names_the_settings_that_differ(tmp_path):
    """`--reuse-data` (the parts script's train/finish calls): the cached data.pt made with these
    data flags is used; missing, or made with another flag, the call exits naming the setting and
    both values instead of making the data again (the sixteenth session's train call regenerated
    80k prompts' data inside its ten minutes because one flag differed from the data call's)."""
    from specdec.train.pipeline import Phases, _data_settings, load_or_make_data

    def no_target():
        raise AssertionError("--reuse-data never loads the generating target")

    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(SystemExit, match=r"--reuse-data: .*data\.pt is not there"):
        load_or_make_data(_args(tmp_path, reuse_data=True), None, work, Phases(), generation_target=no_target)
    made = DistillData.pack([torch.arange(6)], [2], ["code"], {"settings": _data_settings(_args(tmp_path))})
    made.save(work / "data.pt")
    same = load_or_make_data(_args(tmp_path, reuse_data=True), None, work, Phases(), generation_target=no_target)
    assert torch.equal(same.tokens, made.tokens)
    with pytest.raises(SystemExit, match=r"other data settings \(num_prompts: made with 10, asked 80\)"):
        load_or_make_data(_args(tmp_path, reuse_data=True, num_prompts=80), None, work, Phases(),
                          generation_target=no_target)
    with pytest.raises(SystemExit, match="--reuse-data and --regenerate contradict each other"):
        load_or_make_data(_args(tmp_path, reuse_data=True, regenerate=True), None, work, Phases(),
                          generation_target=no_target)
    assert (work / "data.pt").is_file()  # refused before anything was removed


# --------------------------------------------------------------------------- small families fill their share
def test_a_small_family_repeats_as_variants_before_source_files_take_its_share():
    pool = len(mix.family_prompts("header", "train", 10_000))
    got = mix.family_prompts("header", "train", 2 * pool + 5, seed=1, variants=3)
    assert len(got) == 2 * pool + 5
    assert [p.variant for p in got[:pool]] == [0] * pool  # every distinct prompt once before any repeat
    assert Counter(p.variant for p in got) == {0: pool, 1: pool, 2: 5}
    assert len({(mix.normalize(p.text), p.variant) for p in got}) == len(got)
    assert {p.text for p in got[pool:]} <= {p.text for p in got[:pool]}
    assert len(mix.family_prompts("header", "train", 2 * pool, variants=1)) == pool
    with pytest.raises(ValueError, match=r"variants=0 is out of range; allowed: >= 1 \(1: every prompt once"):
        mix.family_prompts("header", "train", 3, variants=0)

    cfg = mix.MixConfig(source=1.0, instruct=0, math=0, header=1.0, self_instruct=0, multi_turn=0, max_variants=2)
    kinds = Counter(p.kind for p in mix.sample_mix(4 * pool, 0, config=cfg))
    assert kinds["code-short-header"] == 2 * pool  # its whole share, as two variants
    one = Counter(p.kind for p in mix.sample_mix(4 * pool, 0, config=replace(cfg, max_variants=1)))
    assert one["code-short-header"] == pool  # each once: the rest of the share went to source files


# --------------------------------------------------------------------------- generation dtype
def test_the_responses_come_from_a_target_in_the_generation_dtype(tmp_path, monkeypatch):
    from _chat_tokenizer import save_chat_tokenizer
    from _tiny_models import make_checkpoint

    from specdec.models import load_target
    from specdec.train.pipeline import (
        GenerationTarget,
        Phases,
        generation_dtype,
        load_or_make_data,
    )

    make_checkpoint("llama", tmp_path, num_hidden_layers=2, vocab_size=96)
    save_chat_tokenizer(tmp_path)
    cpu = torch.device("cpu")
    assert generation_dtype("auto", "float32", cpu) == "float32"
    assert generation_dtype("auto", "float32", torch.device("cuda")) == "bfloat16"
    assert generation_dtype("float16", "float32", cpu) == "float16"
    with pytest.raises(ValueError, match=r"gen_dtype='int8'; allowed: \['auto', 'float32', 'bfloat16', 'float16'\]"):
        generation_dtype("int8", "float32", cpu)

    loads = []

    def load(args, device):
        loads.append(args.dtype)
        return load_target(tmp_path, device=device, dtype=getattr(torch, args.dtype))

    args = _args(tmp_path, gen_dtype="bfloat16", dtype="float32", num_prompts=4)
    tgt = load(args, cpu)
    gen = GenerationTarget(args, tgt, load, cpu, Phases())
    data = load_or_make_data(args, tgt, tmp_path / "work", Phases(), gen)
    assert loads == ["float32", "bfloat16"] and data.meta["gen_dtype"] == "bfloat16" and len(data) > 0
    gen.release()
    load_or_make_data(args, tgt, tmp_path / "work", Phases(), gen)  # cached data: nothing loaded, nothing generated
    assert loads == ["float32", "bfloat16"]
    same = GenerationTarget(_args(tmp_path, gen_dtype="float32"), tgt, load, cpu, Phases())
    assert same() is tgt and loads == ["float32", "bfloat16"]  # the target's own dtype: no second copy
