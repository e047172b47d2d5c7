"""`SpecDecoder` refuses bad input before any work, naming the prompt, and chats.

Prompts of every kind (token ids, tensors, strings, conversations), checked with their
index in the batch; a draft head the drafter would ignore; devices and dtypes; the model's
own context; `chat()` and conversations in `generate` through the tokenizer's chat template
(a tiny word-level tokenizer, `_chat_tokenizer`). After every refusal the decoder still
generates exactly what it generated before.
"""

from __future__ import annotations

import pytest
import torch

from specdec import ConfigError, SamplingParams, SpecConfig, SpecDecoder
from specdec.entrypoints.chat import encode_conversation
from specdec.models import load_target

from _chat_tokenizer import STRICT, chat_tokenizer, save_chat_tokenizer
from _mtp_heads import e2e_cpu  # noqa: F401  (a fixture)
from _tiny_models import make_checkpoint

pytestmark = pytest.mark.usefixtures("e2e_cpu")

GREEDY = SamplingParams(max_new_tokens=6, ignore_eos=True)
PROMPT = [7, 8, 9, 10]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat_target")
    make_checkpoint("llama", folder, num_hidden_layers=2, max_position_embeddings=64)
    save_chat_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def target(folder):
    return load_target(folder)


@pytest.fixture(scope="module")
def dec(target):
    """max_seq_len (128) above the model's context (64): the context is the tighter rule."""
    return SpecDecoder.from_pretrained(target, None, SpecConfig(max_batch_size=3, max_seq_len=128, kv_block_size=4))


@pytest.fixture(scope="module")
def reference(dec):
    return dec.generate([PROMPT], GREEDY)[0].token_ids


@pytest.mark.parametrize(
    "prompts, message",
    [
        ([[1, 2], [], [3]], r"^prompt 1: prompt is empty"),
        ([[1, 2], [3, 96]], r"^prompt 1: prompt token ids \[96\] are out of range; allowed: \[0, 96\)"),
        ([[1, "a"]], r"prompt token ids must be ints, got 'a' \(str\) at position 1"),
        ([[1, 2.0]], r"prompt token ids must be ints, got 2.0 \(float\)"),
        (5, r"prompts must be a prompt \(string, conversation, token ids, tensor\) or a list of them, got int"),
        (None, r"got NoneType"),
        ([[1], 5], r"^prompt 1: a prompt must be a string, a conversation .* got int"),
        (torch.tensor([1.0, 2.0]), r"a tensor prompt must hold integer token ids, got dtype torch.float32"),
        (torch.ones(2, 3, dtype=torch.int64), r"a tensor prompt must be \[T\] or \[1, T\], got shape \(2, 3\)"),
        ([[1], [{"role": "user"}]], r"^prompt 1: message 0 has no 'content'"),
        ([[1] * 60], r"prompt of 60 tokens \+ max_new_tokens=6 = 66 exceeds the model's context max_position_embeddings=64"),
        ([], r"at least one prompt"),
    ],
)
def test_bad_prompts_are_refused_naming_the_prompt_and_the_decoder_still_works(dec, reference, prompts, message):
    with pytest.raises(ConfigError, match=message):
        dec.generate(prompts, GREEDY)
    assert dec.generate([PROMPT], GREEDY)[0].token_ids == reference


@pytest.mark.parametrize(
    "params, message",
    [
        (SamplingParams(top_k=10**9, max_new_tokens=6), r"top_k=1000000000 is out of range; allowed: \[0, 96\]"),
        (SamplingParams(temperature=0.5, max_new_tokens=6), r"temperature=0.5 needs a sampling verifier"),
        ({"max_new_tokens": 3}, r"sampling must be a SamplingParams, got dict"),
    ],
)
def test_bad_sampling_is_refused_before_any_work(dec, reference, params, message):
    with pytest.raises(ConfigError, match=message):
        dec.generate([PROMPT], params)
    assert dec.generate([PROMPT], GREEDY)[0].token_ids == reference


def test_numpy_ids_and_tensors_are_token_ids(dec, reference):
    np = pytest.importorskip("numpy")
    assert dec.generate([list(np.array(PROMPT))], GREEDY)[0].token_ids == reference
    assert dec.generate(torch.tensor([PROMPT]), GREEDY)[0].token_ids == reference


def test_a_request_that_ends_on_its_first_token_has_no_mean_acceptance_length(dec):
    stats = dec.generate([PROMPT], SamplingParams(max_new_tokens=1))[0].stats
    assert stats.steps == 0 and stats.mean_accept_length is None


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_a_draft_head_the_drafter_would_ignore_is_an_error(target, tmp_path, drafter):
    config = SpecConfig(drafter=drafter, max_batch_size=1, max_seq_len=64, kv_block_size=4)
    with pytest.raises(ConfigError, match=rf"drafter='{drafter}'.*(ignore|no model)"):
        SpecDecoder.from_pretrained(target, tmp_path, config)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(dtype="float33"), r"dtype='float33' is not allowed; allowed: \['float32', 'bfloat16', 'float16'\]"),
        (dict(dtype=torch.int64), r"dtype=torch.int64 is not allowed"),
        (dict(device="gpu"), r"device='gpu' is not a device"),
        (dict(config={"drafter": "none"}), r"config must be a SpecConfig, got dict"),
    ],
)
def test_bad_devices_dtypes_and_configs_are_refused_before_loading(folder, kw, message):
    with pytest.raises(ConfigError, match=message):
        SpecDecoder.from_pretrained(folder, None, **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(folder):
    with pytest.raises(ConfigError, match=r"device='cuda' needs CUDA"):
        SpecDecoder.from_pretrained(folder, None, device="cuda")


# ------------------------------------------------------------------------------ chat
CONVERSATION = [{"role": "system", "content": "w3"}, {"role": "user", "content": "w1 w2"}]


def test_a_conversation_is_encoded_with_the_chat_template_and_its_generation_prompt(target):
    ids = encode_conversation(target.tokenizer, CONVERSATION)
    text = "<|im_start|>system\nw3<|im_end|>\n<|im_start|>user\nw1 w2<|im_end|>\n<|im_start|>assistant\n"
    assert ids == target.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[-2:] == [1, 4]  # <|im_start|> assistant: the model answers


def test_chat_equals_generate_on_the_templated_ids_and_generate_takes_conversations(dec, target):
    ids = encode_conversation(target.tokenizer, CONVERSATION)
    want = dec.generate([ids], GREEDY)[0]
    assert dec.chat(CONVERSATION, GREEDY)[0].token_ids == want.token_ids  # one conversation
    both = dec.chat([CONVERSATION, CONVERSATION[1:]], GREEDY)  # a list of them
    assert both[0].token_ids == want.token_ids and both[0].prompt_token_ids == ids
    assert dec.generate(CONVERSATION, GREEDY)[0].token_ids == want.token_ids  # generate: one conversation
    mixed = dec.generate([CONVERSATION, "w1 w2"], GREEDY)  # a conversation and a completion
    assert mixed[0].token_ids == want.token_ids
    assert mixed[1].prompt_token_ids == target.tokenizer("w1 w2", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "conversations, message",
    [
        ([], r"chat\(\) needs a conversation"),
        ("w1", r"chat\(\) needs a conversation"),
        ([CONVERSATION, "w1"], r"^prompt 1: a conversation must be a non-empty list"),
        ([[{"role": "user", "content": 5}]], r"message 0: 'content' must be a string, got 5 \(int\)"),
        ([[{"role": "", "content": "w1"}]], r"message 0: 'role' must be a non-empty string"),
        ([[{"content": "w1"}]], r"message 0 has no 'role'"),
        ([[{"role": "user", "content": "w1"}, "w2"]], r"message 1 must be a dict"),
    ],
)
def test_malformed_conversations_are_refused_naming_the_message(dec, reference, conversations, message):
    with pytest.raises(ConfigError, match=message):
        dec.chat(conversations, GREEDY)
    assert dec.generate([PROMPT], GREEDY)[0].token_ids == reference


def test_a_tokenizer_without_a_chat_template_or_a_template_that_refuses_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"has no chat template; pass plain strings for completions"):
        encode_conversation(chat_tokenizer(template=None), CONVERSATION)
    with pytest.raises(ConfigError, match=r"the chat template refused this conversation: Conversation roles must alternate"):
        encode_conversation(chat_tokenizer(template=STRICT), CONVERSATION)
    with pytest.raises(ConfigError, match=r"a conversation needs a target with a tokenizer"):
        encode_conversation(None, CONVERSATION)


def test_each_request_is_checked_once_through_generate_stream_and_astream(target, monkeypatch):
    """The decoder checks every prompt before any runs, then hands them to the engine unchecked
    (`enqueue`); `astream` goes through the async engine without a second check."""
    import asyncio

    dec = SpecDecoder.from_pretrained(target, None, SpecConfig(max_batch_size=2, max_seq_len=64, kv_block_size=4))
    calls = []
    check = dec.engine.check_request
    monkeypatch.setattr(dec.engine, "check_request", lambda *a, **k: calls.append(a[0]) or check(*a, **k))
    out = dec.generate([PROMPT, [3, 4]], GREEDY)
    assert calls == [PROMPT, [3, 4]] and all(len(r.token_ids) == 6 for r in out)
    calls.clear()
    assert len(list(dec.stream([PROMPT], GREEDY))) >= 1 and calls == [PROMPT]
    calls.clear()

    async def collect():
        return [d async for d in dec.astream([PROMPT, [5, 6]], GREEDY)]

    deltas = asyncio.run(collect())
    assert sorted(calls) == sorted([PROMPT, [5, 6]])  # once each, not again in the async engine or `submit`
    assert sum(len(d.token_ids) for d in deltas) == 12
    dec.async_engine().stop()
