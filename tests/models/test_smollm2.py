"""SmolLM2-135M-Instruct from its GGUF: converted once, greedy continuation == transformers' generate."""

from __future__ import annotations

import pytest
import torch
from _tiny_models import DEVICE, run_decode, run_prefill, spec_config

from specdec.models import convert_gguf, load_target

pytestmark = pytest.mark.slow  # the real 135M model: `pytest -m "not slow"` leaves this file out
PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain why the sky is blue in two sentences.",
]
NEW_TOKENS = 24


def _chat_ids(tokenizer, text: str) -> list[int]:
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tokenizer(chat, add_special_tokens=False)["input_ids"]


def test_gguf_converts_once_to_a_cached_hf_folder(smollm2):
    gguf, folder = smollm2
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert convert_gguf(gguf, root=folder.parent.parent) == folder  # cache hit: not rewritten
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime


def test_smollm2_greedy_continuation_equals_transformers_generate(smollm2, monkeypatch):
    from transformers import AutoModelForCausalLM

    gguf, folder = smollm2
    monkeypatch.setenv("SPECDEC_CACHE", str(folder.parent.parent))  # load_target(gguf) hits this cache
    target = load_target(gguf, device=DEVICE)
    assert target.info.num_layers == 30 and target.info.model_type == "llama"
    assert 2 in target.info.eos_token_ids  # <|im_end|>
    tok = target.tokenizer
    assert tok is not None and tok.chat_template
    prompts = [_chat_ids(tok, p) for p in PROMPTS]
    assert tok.decode(prompts[0]).startswith("<|im_start|>")

    # Ours: batched prefill of the three prompts, then batched greedy decode through the paged cache.
    model = target.model
    cache = model.make_cache(spec_config(max_seq_len=max(map(len, prompts)) + NEW_TOKENS + 1, block_size=16))
    out, q_len = run_prefill(model, cache, prompts, slots=[0, 1, 2])
    nxt = out.logits[torch.arange(3, device=DEVICE), q_len - 1].argmax(-1)  # [3]
    ours = [nxt]
    cache_len, active = q_len.clone(), torch.ones(3, dtype=torch.bool, device=DEVICE)
    for _ in range(NEW_TOKENS - 1):
        nxt = run_decode(model, cache, nxt, cache_len, active).logits[:, 0].argmax(-1)
        ours.append(nxt)
        cache_len += 1
    ours = torch.stack(ours, 1).tolist()  # [3, NEW_TOKENS]

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()
    for b, ids in enumerate(prompts):
        with torch.no_grad():
            # An explicit mask: the prompt holds <|im_end|>, which is also the pad id, and generate
            # would otherwise mask those prompt tokens out.
            x = torch.tensor([ids])
            gen = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False,
                              eos_token_id=None, pad_token_id=tok.pad_token_id)
        ref = gen[0, len(ids):].tolist()
        assert ours[b] == ref, f"prompt {b}: ours {tok.decode(ours[b])!r} != transformers {tok.decode(ref)!r}"
    assert "Paris" in tok.decode(ours[0])


SHIPPED_HEAD_NEW = 64


@pytest.fixture(scope="module")
def hf_greedy(smollm2):
    """transformers' greedy continuation (`SHIPPED_HEAD_NEW` tokens) of a prompt, generated once
    per prompt: the six drafter cases below share two prompt sets (~15 s a generate on CPU)."""
    from transformers import AutoModelForCausalLM

    _, folder = smollm2
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()
    done: dict[tuple[int, ...], list[int]] = {}

    def greedy(ids: list[int], pad_token_id: int) -> list[int]:
        key = (pad_token_id, *ids)
        if key not in done:
            x = torch.tensor([ids])
            with torch.no_grad():
                gen = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=SHIPPED_HEAD_NEW,
                                  do_sample=False, eos_token_id=None, pad_token_id=pad_token_id)
            done[key] = gen[0, len(ids):].tolist()
        return list(done[key])

    return greedy


LINEAR = dict(tree="linear", max_draft_len=5)
DYNAMIC = dict(tree="dynamic", topk=8, max_draft_len=6, max_total_draft_tokens=48)


@pytest.mark.parametrize(
    "drafter, head, prompt_set, shape, steps_measured",
    [
        ("eagle3", "smollm2-eagle3", "heldout", LINEAR, 36),  # tau 3.50 (the e8 head of 2026-12-07; e5: 34, tau 3.71; e4 and e3: 38)
        ("eagle3", "smollm2-eagle3", "heldout", DYNAMIC, 22),  # tau 5.73 (e8; e5: 25, tau 5.04; e4: 24, tau 5.25; e3: 26, tau 4.85)
        ("mtp", "smollm2-mtp", "heldout", LINEAR, 43),  # tau 2.93 (m7, 2026-12-07; m6: 45, 2.80; m5: 50; source-only: 61)
        ("mtp", "smollm2-mtp", "heldout", DYNAMIC, 28),  # tau 4.50 (m7; m6: 26, 4.85; m5: 29, 4.34; source-only: 38)
        ("ngram", None, "edit", dict(tree="linear", max_draft_len=8), 44),  # tau 2.86
        ("ngram", None, "edit", dict(tree="dynamic", topk=4, max_draft_len=8), 37),  # tau 3.41
    ],
    ids=["eagle3-linear", "eagle3-dynamic", "mtp-linear", "mtp-dynamic", "ngram-chain", "ngram-tree"],
)
def test_real_drafters_on_smollm2_are_lossless_and_accept_real_drafts(smollm2, hf_greedy, monkeypatch, drafter, head,
                                                                     prompt_set, shape, steps_measured):
    """SmolLM2 + each real drafter, 64 greedy tokens on 2 shipped prompts: identical to
    transformers' greedy generate, and the acceptance measured for it (2026-12-02; EAGLE-3 2026-12-06, MTP 2026-12-07), within one
    step: 126 tokens after prefill in `steps_measured` steps +- 1.

    A floor below the measured value let bugs that keep outputs exact pass: feeding the drafter
    the tree's first rows instead of the accepted path's hidden states dropped the dynamic tree
    from 5.04 to 3.50 (EAGLE-3) and 3.32 to 2.80 (MTP) while the old floors were 3.0 and 2.8.
    One step either way is ~0.2 of tau for the tree, ~0.05 for the chains; a planted bug like
    that one costs 11 steps. A change that moves acceptance on purpose (a retrained head)
    updates these numbers. Heads: specdec's trained EAGLE-3 and MTP heads on 2 held-out prompts
    (one code, one chat); ngram on the 2 shipped `edit` prompts (repeat a file with a rename).
    """
    from importlib import resources

    from specdec import SamplingParams, SpecConfig
    from specdec.entrypoints.decoder import SpecDecoder
    from specdec.train.prompts import encode_prompt, frozen_edit_prompts, frozen_heldout_prompts

    gguf, folder = smollm2
    monkeypatch.setenv("SPECDEC_CACHE", str(folder.parent.parent))
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' torch references (kernels: own suites)
    target = load_target(gguf, device=DEVICE)
    draft = None if head is None else str(resources.files("specdec") / "assets" / "heads" / head)
    config = SpecConfig(drafter=drafter, max_batch_size=2, max_seq_len=1024, **shape)
    dec = SpecDecoder.from_pretrained(target, draft, config)
    chosen = frozen_heldout_prompts(2) if prompt_set == "heldout" else frozen_edit_prompts(2)
    prompts = [encode_prompt(p, target.tokenizer) for p in chosen]
    outs = dec.generate(prompts, SamplingParams(max_new_tokens=SHIPPED_HEAD_NEW, ignore_eos=True))

    steps = emitted = 0
    for ids, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(ids, target.tokenizer.pad_token_id)
        steps += out.stats.steps
        emitted += len(out.token_ids) - 1
    assert emitted == 126
    assert abs(steps - steps_measured) <= 1, (
        f"{drafter} {shape}: {steps} steps (mean acceptance {emitted / steps:.2f}), measured {steps_measured} "
        f"({emitted / steps_measured:.2f}): what the drafter is fed, or how it drafts, changed")
