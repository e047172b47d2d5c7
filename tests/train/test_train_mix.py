"""The diverse prompt mix (`specdec.train.mix`, `expand`, `conversation`, `categories`): seeded and
deduplicated, held out by construction (a held-out topic or template never reaches training),
multi-turn prompts built by a generate callable, the frozen per-category set, and tau per
category in the evaluation."""

import json
import zlib
from collections import Counter

import pytest

from specdec.train import mix
from specdec.train.categories import CATEGORIES, PER_CATEGORY, category_of, frozen_category_prompts
from specdec.train.conversation import MULTI_TURN, encode_any, messages_prompt, prompt_messages
from specdec.train.expand import FOLLOW_UPS, HELDOUT_FOLLOW_UPS, build_conversations, clean_instruction, self_instruct
from specdec.train.prompts import Prompt, is_heldout

from _train_tiny import one_thread


class FakeGenerate:
    """A `Generate` that answers from the last message and counts its calls."""

    def __init__(self, reply=lambda conv: f"Answer to: {conv[-1]['content'][:30]}"):
        self.reply, self.calls, self.convs = reply, 0, 0

    def __call__(self, convs):
        self.calls += 1
        self.convs += len(convs)
        return [self.reply(c) for c in convs]


def _pair(p: Prompt) -> tuple[str, str, str]:
    family, rest = p.source.split(":", 2)[1:]
    topic, template = rest.split("|")[:2]
    return family, topic, template


def _all(split):
    """Every templated prompt of `split`, both instruction pools."""
    instruct = mix.dedup(mix.instruct_prompts(split) + mix.instruct_prompts(split, "wide"))
    return instruct + mix.header_prompts(split) + mix.math_prompts(split, 200)


# --------------------------------------------------------------------------- determinism, dedup
def test_the_families_are_deterministic_and_seeded():
    for family in mix.FAMILIES:
        a = mix.family_prompts(family, "train", 40, seed=3)
        assert a == mix.family_prompts(family, "train", 40, seed=3) and len(a) == 40
        assert a != mix.family_prompts(family, "train", 40, seed=4)
    fake = FakeGenerate()
    cfg = mix.MixConfig(source=0.0)
    assert mix.sample_mix(60, 1, config=cfg, generate=fake) == mix.sample_mix(60, 1, config=cfg, generate=FakeGenerate())


def test_dedup_judges_normalized_text_and_keeps_the_first():
    a = Prompt("general-chat", "mix:instruct:bees|facts", "Tell me about  BEES!", True)
    b = Prompt("general-chat", "mix:instruct:bees|facts2", "tell me about bees", True)
    c = Prompt("general-chat", "mix:instruct:bees|facts", "Tell me about wasps.", True)
    assert mix.normalize(a.text) == mix.normalize(b.text) == "tell me about bees"
    assert mix.dedup([a, b, c]) == [a, c]
    for split in mix.SPLITS:
        texts = [mix.normalize(p.text) for p in mix.sample_mix(150, 0, split=split, config=mix.MixConfig(source=0.0),
                                                                generate=FakeGenerate())]
        assert len(texts) == len(set(texts))


def test_the_mix_fills_its_shares_and_leaves_what_runs_dry_to_source_files():
    cfg = mix.MixConfig(source=0.0, instruct=1, math=1, header=1, self_instruct=0, multi_turn=0)
    kinds = Counter(p.kind for p in mix.sample_mix(90, 0, config=cfg))
    assert kinds["math"] == kinds["code-short-header"] == 30
    assert kinds["general-chat"] + kinds["chat-about-code"] == 30
    with_files = mix.sample_mix(20, 0, config=mix.MixConfig(source=0.0, instruct=0, math=0, header=0), generate=None)
    assert len(with_files) == 20 and not any(p.source.startswith("mix:") for p in with_files)  # no generate: files


# --------------------------------------------------------------------------- split by construction
def test_no_heldout_topic_or_template_reaches_training():
    train, held = _all("train"), _all("heldout")
    train_pairs = {_pair(p) for p in train}
    held_pairs = {_pair(p) for p in held}
    assert train_pairs and held_pairs and not train_pairs & held_pairs
    held_parts = mix.HELDOUT_TOPICS | mix.HELDOUT_TEMPLATES | mix.HELDOUT_MATH_TOPICS | mix.HELDOUT_MATH_TEMPLATES \
        | mix.HELDOUT_HEADER_DOMAINS | set(mix.HELDOUT_HEADER_STYLES)
    for family, topic, template in train_pairs:
        assert topic not in held_parts and template not in held_parts, (family, topic, template)
    for family, topic, template in held_pairs:
        assert topic in held_parts or template in held_parts, (family, topic, template)
    held_texts = {mix.normalize(p.text) for p in held}
    assert not held_texts & {mix.normalize(p.text) for p in train}
    # a comparison in training never names a held-out topic as its second topic either
    assert not any(t in p.text for p in train for t in mix.HELDOUT_TOPICS)


def test_the_wide_pool_adds_only_training_topics_and_ways_of_asking():
    from specdec.train.wide_topics import MORE_TEMPLATES, MORE_TOPICS

    held = {mix.normalize(t) for t in mix.HELDOUT_TOPICS}
    base = {mix.normalize(t) for v in mix.TOPICS.values() for t in v}
    more = [t for v in MORE_TOPICS.values() for t in v]
    assert len({mix.normalize(t) for t in more}) == len(more) >= 300  # no topic twice
    for t in more:
        n = mix.normalize(t)
        assert n not in base and not any(h in n for h in held), t  # no held-out topic, even inside another
        assert "|" not in t and ":" not in t and t == t.strip(), t  # topics go into Prompt.source
    assert not set(MORE_TEMPLATES) & (set(mix.INSTRUCT_TEMPLATES) | mix.HELDOUT_TEMPLATES)
    for _, text in MORE_TEMPLATES.values():
        assert "{t}" in text and text.format(t="x", u="y")
    base_train = mix.instruct_prompts("train")
    wide_train, wide_held = mix.instruct_prompts("train", "wide"), mix.instruct_prompts("heldout", "wide")
    assert {p.text for p in base_train} <= {p.text for p in wide_train}  # the base pool, and more
    assert len(mix.dedup(wide_train)) == len(wide_train) == 11616 and len(base_train) == 696  # as the docs say
    assert {p.kind for p in wide_train} == {"general-chat", "chat-about-code"}
    assert all(mix.split_of(p.source) == "train" for p in wide_train)
    assert all(mix.split_of(p.source) == "heldout" for p in wide_held)
    assert not any(h in p.text.lower() for p in wide_train for h in held)
    frozen = {mix.normalize(p.text) for p in frozen_category_prompts()}
    assert not frozen & {mix.normalize(p.text) for p in wide_train}
    with pytest.raises(ValueError, match=r"instruct pool='narrow' is unknown; allowed: \['base', 'wide'\]"):
        mix.MixConfig(instruct_pool="narrow")
    with pytest.raises(ValueError, match=r"instruct pool='all' is unknown"):
        mix.instruct_prompts("train", "all")


def test_the_wide_pool_fills_the_instruct_share_without_repeats():
    cfg = dict(source=0.0, instruct=1.0, math=0.0, header=0.0, self_instruct=0.0, multi_turn=0.0, max_variants=8)
    n = 2 * len(mix.instruct_prompts("train"))
    wide = mix.sample_mix(n, 0, config=mix.MixConfig(**cfg))
    base = mix.sample_mix(n, 0, config=mix.MixConfig(**cfg, instruct_pool="base"))
    assert len(wide) == len(base) == n
    assert all(p.variant == 0 for p in wide)  # every request distinct: none answered again by sampling
    assert sum(p.variant > 0 for p in base) == n - len(mix.instruct_prompts("train"))


def test_expansions_keep_their_seeds_split():
    seeds = mix.family_prompts("instruct", "train", 12, seed=0)
    new = self_instruct(FakeGenerate(lambda c: "1. Request: \"How do I learn something new every week?\""), seeds)
    assert new and all(mix.split_of(p.source) == "train" and p.source.endswith("|self") for p in new)
    convs = build_conversations(FakeGenerate(), seeds, seed=0, split="train")
    for p in convs:
        assert mix.split_of(p.source) == "train"
        asked = [m["content"] for m in prompt_messages(p)[1::2]]
        assert not {FOLLOW_UPS[k] for k in HELDOUT_FOLLOW_UPS} & set(asked)
    held = build_conversations(FakeGenerate(), mix.family_prompts("instruct", "train", 12, 0), seed=0, split="heldout")
    assert all(mix.split_of(p.source) == "heldout" for p in held)  # a held-out follow-up makes it held out
    trained = mix.sample_mix(200, 0, config=mix.MixConfig(source=0.0), generate=FakeGenerate())
    assert all(mix.split_of(p.source) == "train" if p.source.startswith("mix:") else not is_heldout(p.source) for p in trained)


def test_split_and_config_errors_name_the_bad_value():
    with pytest.raises(ValueError, match=r"source='stdlib:json.py' is not a mix source"):
        mix.split_of("stdlib:json.py")
    with pytest.raises(ValueError, match=r"split='test' is unknown; allowed: \['train', 'heldout'\]"):
        mix.instruct_prompts("test")
    with pytest.raises(ValueError, match=r"family='poems' is unknown; allowed: \['instruct', 'math', 'header'\]"):
        mix.family_prompts("poems", "train", 3)
    with pytest.raises(ValueError, match=r"mix shares \{'math': -1\} are invalid"):
        mix.MixConfig(math=-1).shares()
    with pytest.raises(ValueError, match=r"header style='doctest' is unknown"):
        mix.header_text(mix.HEADERS["numbers"][0], "doctest")


# --------------------------------------------------------------------------- multi-turn, self-instruct
def test_multi_turn_conversations_alternate_and_end_on_a_user_turn():
    seeds = mix.family_prompts("instruct", "train", 10, seed=2)
    fake = FakeGenerate()
    convs = build_conversations(fake, seeds, turns=(2, 3), seed=5)
    assert len(convs) == 10 and fake.calls == 2  # one batched call per round
    users = Counter()
    for seed, p in zip(seeds, convs):
        msgs = prompt_messages(p)
        assert p.kind == MULTI_TURN and p.chat and msgs[0]["content"] == seed.text
        assert [m["role"] for m in msgs] == ["user", "assistant"] * (len(msgs) // 2) + ["user"]
        assert msgs[1]["content"] == f"Answer to: {seed.text[:30]}".strip()
        users[len(msgs) // 2 + 1] += 1
    assert set(users) == {2, 3}
    assert convs == build_conversations(FakeGenerate(), seeds, turns=(2, 3), seed=5)
    own = build_conversations(FakeGenerate(lambda c: "What about on weekends?"), seeds[:4], turns=(2,), self_follow_up=1.0)
    assert all(prompt_messages(p)[-1]["content"] == "What about on weekends?" and p.source.endswith("|mt:self") for p in own)
    with pytest.raises(ValueError, match=r"turns=\(1,\) must be user-turn counts >= 2"):
        build_conversations(fake, seeds, turns=(1,))
    with pytest.raises(ValueError, match="generate returned 0 replies for 10 conversations"):
        build_conversations(lambda convs: [], seeds)


def test_clean_instruction_and_self_instruct_drop_unusable_replies():
    assert clean_instruction('\n  2) New request: "Plan a picnic for six people."  \nMore text') == "Plan a picnic for six people."
    assert clean_instruction("ok") is None and clean_instruction("") is None and clean_instruction("x" * 400) is None
    seeds = mix.family_prompts("instruct", "train", 6, seed=0)
    echo = self_instruct(FakeGenerate(lambda c: c[-1]["content"].split("\n\n")[1]), seeds)  # repeats its seed
    assert echo == []
    with pytest.raises(ValueError, match="self_instruct needs chat seeds"):
        self_instruct(FakeGenerate(), mix.family_prompts("header", "train", 2))


def test_multi_turn_prompts_encode_every_message():
    p = messages_prompt([{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"},
                         {"role": "user", "content": "d"}], "mix:instruct:bees|facts|mt:why")
    assert encode_any(p, None, 96) == [b % 96 for b in b"ab\nc\nd"]
    plain = Prompt("general-chat", "mix:instruct:bees|facts", "hi", True)
    assert encode_any(plain, None, 96) == [b % 96 for b in b"hi"]
    with pytest.raises(ValueError, match=r"message 1 is .*; allowed: \{'role': 'assistant'"):
        messages_prompt([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "x")
    with pytest.raises(ValueError, match="ending with a user message"):
        messages_prompt([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "x")


def test_the_target_writes_conversations_and_their_distillation(tmp_path, monkeypatch):
    from _chat_tokenizer import save_chat_tokenizer
    from _tiny_models import make_checkpoint

    from specdec.models import load_target
    from specdec.train.conversation import build_mix_distill_data
    from specdec.train.expand import target_generate

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' torch references (kernels: own suites)
    with one_thread():
        make_checkpoint("llama", tmp_path, num_hidden_layers=2, vocab_size=96)
        save_chat_tokenizer(tmp_path)
        target = load_target(tmp_path)
        generate = target_generate(target, max_new_tokens=6, batch_size=4)
        seeds = [Prompt("general-chat", f"mix:instruct:bees|facts{i}", f"w{i} w{i + 1} w7", True) for i in range(3)]
        convs = build_conversations(generate, seeds, turns=(2,))
        assert all(len(prompt_messages(p)) == 3 and prompt_messages(p)[1]["content"] for p in convs)
        data = build_mix_distill_data(target, convs + seeds, max_new_tokens=5, batch_size=4, progress=False)
    assert len(data) == 6 and data.kinds == [MULTI_TURN] * 3 + ["general-chat"] * 3
    assert data.meta["response_tokens"] == data.num_response_tokens > 0
    assert all(int(data.prompt_lens[i]) > int(data.prompt_lens[i + 3]) for i in range(3))  # the history is in the prompt


# --------------------------------------------------------------------------- the frozen set
def test_the_frozen_set_covers_every_category_held_out():
    prompts = frozen_category_prompts()
    counts = Counter(category_of(p) for p in prompts)
    assert counts == {c: PER_CATEGORY for c in CATEGORIES}
    assert [category_of(p) for p in prompts] == [c for c in CATEGORIES for _ in range(PER_CATEGORY)]
    assert len({p.text for p in prompts}) == len(prompts)
    for p in prompts:
        if p.source.startswith("mix:"):
            assert mix.split_of(p.source) == "heldout", p.source
        else:
            assert is_heldout(p.source.split("|")[0]), p.source
        assert p.chat == (category_of(p) not in ("code-long-context", "code-short-header"))
    for p in prompts:
        if p.kind == MULTI_TURN:
            msgs = prompt_messages(p)
            assert len(msgs) in (3, 5) and all(m["content"].strip() for m in msgs)
    trained = {mix.normalize(p.text) for p in _all("train")}
    assert not trained & {mix.normalize(p.text) for p in prompts}
    assert [category_of(p) for p in frozen_category_prompts(2, ("math", "multi-turn"))] == ["math"] * 2 + ["multi-turn"] * 2
    with pytest.raises(ValueError, match=rf"n=17 prompts per category asked for; allowed: \[1, {PER_CATEGORY}\]"):
        frozen_category_prompts(17)
    with pytest.raises(ValueError, match=r"unknown categories \['poetry'\]"):
        frozen_category_prompts(1, ("poetry",))


def test_the_frozen_recipe_is_deterministic_apart_from_the_target():
    from specdec.train.categories import make_categories_heldout

    a = make_categories_heldout(FakeGenerate(), per_category=4)
    assert a == make_categories_heldout(FakeGenerate(), per_category=4)
    assert Counter(category_of(p) for p in a) == {c: 4 for c in CATEGORIES}
    shipped = frozen_category_prompts()
    non_mt = [p for p in make_categories_heldout(FakeGenerate()) if p.kind != MULTI_TURN]
    assert non_mt == [p for p in shipped if p.kind != MULTI_TURN]  # the shipped file is this recipe
    firsts = [prompt_messages(p)[0]["content"] for p in shipped if p.kind == MULTI_TURN]
    assert firsts == [prompt_messages(p)[0]["content"] for p in make_categories_heldout(FakeGenerate()) if p.kind == MULTI_TURN]


# --------------------------------------------------------------------------- tau per category
def test_conditional_acceptance_is_the_share_of_steps_past_each_depth_among_those_that_reached_it():
    from specdec.train.evaluate import conditional_acceptance

    # 5 steps: a = 0, 1, 3, 3, 2 -> reached depth 0: 5, depth 1: 4, depth 2: 3, depth 3: 2, depth 4: 0
    assert conditional_acceptance([0, 1, 3, 3, 2], 5)[:3] == [4 / 5, 3 / 4, 2 / 3]
    rates = conditional_acceptance([0, 1, 3, 3, 2], 5)
    assert rates[3] == 0.0 and rates[4] != rates[4]  # none of the two at depth 3 went on; nobody reached depth 4
    assert conditional_acceptance([], 2)[0] != conditional_acceptance([], 2)[0]  # NaN: no step at all



def test_evaluation_reports_tau_per_category(tmp_path, monkeypatch):
    from _train_tiny import make_target

    from specdec.train.evaluate import evaluate_head, format_depth_table, format_table

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    prompts = [Prompt("code", "stdlib:x.py", "def f(a, b):\n    return a + b\n", False),
               Prompt("code-short-header", "mix:header:numbers|plain|gcd", "def gcd(a, b):\n", False),
               Prompt("explain", "stdlib:x.py", "Explain: x = 1", True),
               Prompt("general-chat", "mix:instruct:bees|facts", "Tell me about bees.", True),
               Prompt("math", "mix:math:toys|buy", "Ana buys 3 toys at $4 each.", True),
               messages_prompt([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                                {"role": "user", "content": "Why?"}], "mix:instruct:bees|facts|mt:why")]
    with one_thread():
        target = make_target(tmp_path / "t")
        rows = evaluate_head(target, None, prompts, setups=("target", "linear"), drafter="ngram", batch_size=3,
                             max_new_tokens=12, warmup=False, progress=False)
    for r in rows:
        assert list(r["tau_by_category"]) == list(CATEGORIES)
        assert {"tau", "tau_code", "tau_chat"} <= set(r) and r["batch_size"] == 3 and r["dtype"] == "float32"
    assert all(v == 1.0 for v in rows[0]["tau_by_category"].values())
    assert rows[1]["same_as_target"] == 1.0 and all(v >= 1.0 for v in rows[1]["tau_by_category"].values())
    table = format_table(rows)
    assert "| tau (general-chat) |" in table and "| tau (multi-turn) |" in table
    assert table.splitlines()[1] == "|" + "---|" * (9 + len(CATEGORIES))
    assert "batch size 3, dtype float32; target-only speed measured in the same run" in table
    old = {k: v for k, v in rows[0].items() if k not in ("tau_by_category", "batch_size", "dtype")}
    assert "tau (multi-turn)" not in format_table([old])  # rows without categories: the old table
    # acceptance by depth: none for target-only; for the chain, "all" then each category, whose steps add up
    assert rows[0]["depth_acceptance"] is None
    depth = rows[1]["depth_acceptance"]
    assert list(depth) == ["all", *CATEGORIES] and all(len(v["p"]) == 8 for v in depth.values())  # ngram chain D=8
    assert depth["all"]["steps"] == sum(depth[c]["steps"] for c in CATEGORIES) > 0
    depth_table = format_depth_table(rows)
    assert depth_table.splitlines()[0].startswith("| setup | category | steps | p1 | p2 |")
    assert f"| {rows[1]['name']} | general-chat |" in depth_table and format_depth_table(rows[:1]) == ""
    json.dumps(rows)


def test_the_command_line_reads_the_category_set():
    import argparse

    from specdec.train.cli import _prompts_for_eval
    from specdec.train.pipeline import _mix_config

    args = argparse.Namespace(eval_source="categories", eval_prompts=2, seed=0)
    assert Counter(category_of(p) for p in _prompts_for_eval(args)) == {c: 2 for c in CATEGORIES}
    cfg = _mix_config(argparse.Namespace(mix_shares="math=0.5,source=0.5", roots="stdlib"))
    assert cfg.shares()["math"] == 0.5 and cfg.roots == ("stdlib",) and len(cfg.exclude_texts) > 90
    with pytest.raises(SystemExit, match=r"--mix-shares names \['poems'\]"):
        _mix_config(argparse.Namespace(mix_shares="poems=1", roots="stdlib"))


def test_the_pipeline_distills_the_diverse_mix_with_conversations(tmp_path, monkeypatch):
    import argparse

    from _chat_tokenizer import save_chat_tokenizer
    from _tiny_models import make_checkpoint

    from specdec.models import load_target
    from specdec.train.pipeline import Phases, load_or_make_data

    args = argparse.Namespace(target=str(tmp_path), num_prompts=12, max_new_tokens=4, max_prompt_tokens=200, temperature=0.0,
                              seed=0, roots="stdlib", data_mix="diverse", gen_batch_size=8, gen_minutes=None,
                              gen_cuda_graph="off", regenerate=False,
                              mix_shares="source=0.25,instruct=0.25,math=0.1,header=0.1,self_instruct=0.1,multi_turn=0.2")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' torch references (kernels: own suites)
    with one_thread():
        make_checkpoint("llama", tmp_path, num_hidden_layers=2, vocab_size=96)
        save_chat_tokenizer(tmp_path)
        target = load_target(tmp_path)
        data = load_or_make_data(args, target, tmp_path / "work", Phases())
    assert MULTI_TURN in data.kinds and "math" in data.kinds and "code-short-header" in data.kinds
    assert data.meta["settings"]["data_mix"] == "diverse" and (tmp_path / "work" / "data.pt").is_file()
    assert data.meta["settings"]["instruct_pool"] == "wide"  # a cache of the other pool is made again


def test_self_instruct_makes_several_tries_per_seed_when_the_pool_is_small():
    seeds = mix.family_prompts("instruct", "train", 3, seed=0)
    fake = FakeGenerate(lambda c: f"Please answer request number {zlib.crc32(c[-1]['content'].encode())}")
    new = self_instruct(fake, seeds, per_seed=4)
    assert fake.convs == 12 and len(new) == 12  # each try asks differently (its angle)
    greedy = FakeGenerate(lambda c: f"Please answer request number {zlib.crc32(c[-1]['content'].encode())}")
    assert len(self_instruct(greedy, seeds, per_seed=9)) == 18 and greedy.convs == 18  # 6 angles: no greedy repeats
    draws = iter(range(10**6))
    sampler = FakeGenerate(lambda c: f"Please answer sampled request number {next(draws)}")
    more = self_instruct(FakeGenerate(greedy.reply), seeds, per_seed=9, sample=sampler)
    assert len(more) == 27 and sampler.convs == 9  # tries 7-9 of each seed were sampled
    cfg = mix.MixConfig(source=0.0, instruct=0.0, math=0.0, header=0.0, self_instruct=1.0, multi_turn=0.0,
                        instruct_pool="base")
    n = len(mix.instruct_prompts("train")) + 50
    got = mix.sample_mix(n, 0, config=cfg, generate=FakeGenerate(lambda c: f"Request {zlib.crc32(c[-1]['content'].encode())}"))
    assert sum(p.source.endswith("|self") for p in got) > len(mix.instruct_prompts("train"))
