"""`specdec serve` against the official `openai` client, live on localhost (CPU, tiny model).

A tiny random Llama with a word-level chat tokenizer and a random EAGLE-3 head runs behind
uvicorn in a background thread; the tests call it as any OpenAI client would: completions
and chat, streamed and not, 16 concurrent clients, a client that disconnects mid-stream
(its slot comes back), and bad requests (400 naming the field, no effect on the others).
Greedy answers are compared with the same decoder's `generate` on the same ids.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import torch  # noqa: E402

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import specdec  # noqa: E402
from specdec import SamplingParams, SpecConfig, SpecDecoder  # noqa: E402
from specdec.entrypoints.server import build_app  # noqa: E402
from specdec.testing.kit import references_on_cpu  # noqa: E402

from _chat_tokenizer import save_chat_tokenizer  # noqa: E402
from _eagle3_heads import saved_tiny_head  # noqa: E402
from _tiny_models import make_checkpoint  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning")
WORDS = "w3 w17 w40 w8 w8 w21"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _serving(decoder, model_name: str):
    """`build_app(decoder)` behind uvicorn in a thread; yields (base URL, an openai client) once
    /health answers, and stops the server after. On the CPU the ops run their torch references
    (as in _mtp_heads.e2e_cpu)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with references_on_cpu(device):
        port = _free_port()
        srv = uvicorn.Server(uvicorn.Config(build_app(decoder, model_name=model_name), host="127.0.0.1", port=port,
                                            log_level="warning"))
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        try:
            yield base, openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        finally:
            srv.should_exit = True
            thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chatllama")
    make_checkpoint("llama", folder, num_hidden_layers=8, seed=3)
    save_chat_tokenizer(folder)
    head = tmp_path_factory.mktemp("head")
    saved_tiny_head(head, seed=1, capture_layers=(1, 3, 4), std=0.1)
    config = SpecConfig(drafter="eagle3", verifier="target-only", max_draft_len=3, max_batch_size=4, max_seq_len=128,
                        kv_block_size=4)
    target = specdec.load_target(folder)
    dec = SpecDecoder.from_pretrained(target, head, config)
    ref = SpecDecoder.from_pretrained(target, head, config)  # its own engine, for reference answers
    with _serving(dec, "tiny") as (base, client):
        yield dict(dec=dec, ref=ref, base=base, client=client, tok=dec.target.tokenizer)


def _expected_text(server, ids: list[int], n: int) -> str:
    """The greedy answer of a separate decoder on the same target and head."""
    out = server["ref"].generate([ids], SamplingParams(max_new_tokens=n, ignore_eos=True))[0]
    return server["tok"].decode(out.token_ids, skip_special_tokens=True)


def _metrics(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics").text
    return {k: float(v) for k, v in (line.split() for line in text.strip().splitlines())}


def test_models_and_health(server):
    assert [m.id for m in server["client"].models.list().data] == ["tiny"]
    assert httpx.get(server["base"] + "/health").json()["status"] == "ok"


def test_completion_streamed_and_not_equal_the_decoder_greedy_tokens(server):
    tok, client = server["tok"], server["client"]
    ids = tok(WORDS, add_special_tokens=False)["input_ids"]
    want = _expected_text(server, ids, 12)
    out = client.completions.create(model="tiny", prompt=WORDS, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].text == want and out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 12 and out.usage.prompt_tokens == len(ids)
    chunks = client.completions.create(model="tiny", prompt=WORDS, max_tokens=12, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    pieces = list(chunks)
    assert "".join(c.choices[0].text for c in pieces) == want
    assert pieces[-1].choices[0].finish_reason == "length"


def test_a_token_id_prompt_is_accepted(server):
    ids = server["tok"](WORDS, add_special_tokens=False)["input_ids"]
    body = {"model": "tiny", "prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = httpx.post(server["base"] + "/v1/completions", json=body, timeout=120).json()
    assert r["choices"][0]["text"] == _expected_text(server, ids, 6)


def test_chat_streamed_and_not(server):
    client = server["client"]
    messages = [{"role": "user", "content": WORDS}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                         extra_body={"ignore_eos": True})
    text = out.choices[0].message.content
    assert out.choices[0].message.role == "assistant" and out.choices[0].finish_reason == "length" and text
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in stream) == text
    # the chat template is applied: the same words as a raw completion give another continuation
    tok = server["tok"]
    templated = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    raw = client.completions.create(model="tiny", prompt=templated, max_tokens=10, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert raw.choices[0].text == text


def test_sixteen_concurrent_clients_each_get_their_solo_answer(server):
    client = server["client"]
    prompts = [" ".join(f"w{(7 * i + j) % 80 + 6}" for j in range(1 + i % 5)) for i in range(16)]

    def ask(p):
        r = client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        return r.choices[0].text

    tok = server["tok"]
    solo = [_expected_text(server, tok(p, add_special_tokens=False)["input_ids"], 8) for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, prompts))
    assert together == solo


def test_seeded_sampling_is_reproducible_and_stop_strings_cut_the_text(server):
    client = server["client"]
    kw = dict(model="tiny", prompt=WORDS, max_tokens=16, temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    a, b = (client.completions.create(**kw).choices[0].text for _ in range(2))
    assert a == b
    words = a.split()
    if len(words) >= 3:
        stop = words[2]
        cut = client.completions.create(**{**kw, "stop": [stop]}).choices[0]
        assert cut.finish_reason == "stop" and stop not in cut.text and a.startswith(cut.text)


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server):
    body = {"model": "tiny", "prompt": WORDS, "max_tokens": 100, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server["base"] + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # one chunk, then hang up
    for _ in range(200):
        m = _metrics(server["base"])
        if m["specdec_requests_running"] == 0 and m["specdec_slots_free"] == 4:
            break
        time.sleep(0.05)
    cache = server["dec"].engine.runner.cache
    assert m["specdec_slots_free"] == 4 and m["specdec_kv_blocks_free"] == cache.num_blocks


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -1, r"temperature=-1 is out of range"),
        ("max_tokens", 0, r"max_tokens=0 is out of range"),
        ("top_p", 1.5, r"top_p=1.5 is out of range"),
        ("top_k", 10**9, r"top_k=1000000000 is out of range"),
        ("n", 2, r"n=2 is not supported"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(server, field, value, message):
    extension = field in ("top_k", "min_p", "ignore_eos", "num_draft_tokens")  # not in the openai client's signature
    kw = {"extra_body": {field: value}} if extension else {field: value}
    with pytest.raises(openai.BadRequestError) as err:
        server["client"].completions.create(model="tiny", prompt=WORDS, **kw)
    assert err.value.status_code == 400
    assert err.value.body["param"] == field
    assert re.search(message, err.value.body["message"])


def test_an_overlong_prompt_is_a_400_naming_the_limit(server):
    with pytest.raises(openai.BadRequestError, match=r"max_seq_len=128"):
        server["client"].completions.create(model="tiny", prompt=" ".join(["w9"] * 130), max_tokens=4)
    # and it did not disturb anyone: a normal request still works
    out = server["client"].completions.create(model="tiny", prompt=WORDS, max_tokens=4, temperature=0,
                                              extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 4


def test_an_unknown_model_is_a_404_naming_the_served_one(server):
    with pytest.raises(openai.NotFoundError) as err:
        server["client"].completions.create(model="nope", prompt=WORDS, max_tokens=4)
    assert err.value.status_code == 404
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    assert "'nope' does not exist" in err.value.body["message"] and "'tiny'" in err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        server["client"].chat.completions.create(model="nope", messages=[{"role": "user", "content": WORDS}])


def test_every_request_is_one_access_log_line(server, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="specdec.entrypoints.server"):
        server["client"].completions.create(model="tiny", prompt=WORDS, max_tokens=5, temperature=0,
                                            extra_body={"ignore_eos": True})
        for _ in server["client"].completions.create(model="tiny", prompt=WORDS, max_tokens=3, temperature=0,
                                                     stream=True, extra_body={"ignore_eos": True}):
            pass
        with pytest.raises(openai.BadRequestError):
            server["client"].completions.create(model="tiny", prompt=WORDS, temperature=-1)
        for _ in range(100):  # the streamed request logs when its stream closes
            if len([r for r in caplog.records if r.name == "specdec.entrypoints.server"]) >= 3:
                break
            time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if r.name == "specdec.entrypoints.server"]
    assert len(lines) == 3, lines
    prompt = len(server["tok"](WORDS, add_special_tokens=False)["input_ids"])
    assert re.fullmatch(rf"POST /v1/completions 200 prompt_tokens={prompt} completion_tokens=5 seconds=[0-9.]+ "
                        r"mean_acceptance=[0-9.]+", lines[0]), lines[0]
    assert re.match(rf"POST /v1/completions 200 prompt_tokens={prompt} completion_tokens=3 ", lines[1]), lines[1]
    assert re.match(r"POST /v1/completions 400 prompt_tokens=0 completion_tokens=0 ", lines[2]), lines[2]


def test_several_stop_strings_cut_at_the_earliest_match_streamed_or_not(server):
    client = server["client"]
    kw = dict(model="tiny", prompt=WORDS, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text
    words = full.split()
    assert len(words) >= 6, full
    spanning = " ".join(words[3:5])  # a stop string across a token boundary
    cases = [
        [words[4], words[2], "never-in-the-text"],  # the earliest match wins, whatever the list order
        ["never-in-the-text", spanning],
        [words[5], spanning],
    ]
    for stops in cases:
        hits = [full.find(s) for s in stops if s in full]
        want = full[: min(hits)]
        got = client.completions.create(**kw, stop=stops).choices[0]
        assert got.text == want and got.finish_reason == "stop", (stops, got.text, want)
        streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stop=stops, stream=True))
        assert streamed == want, (stops, streamed, want)


# ----------------------------------------------------------------------------- byte-level BPE
@pytest.fixture(scope="module")
def bpe_server(tmp_path_factory):
    """A target whose tokenizer is byte-level BPE (characters split across tokens), served."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("bpe")
    corpus = ["héllo wörld, ça va? 世界你好 🎉 naïve café", "日本語のテキスト and plain words", "€ ± µ ß ñ"] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=320, min_frequency=1, show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=None)
    make_checkpoint("llama", folder, num_hidden_layers=2, seed=9, vocab_size=len(tok), initializer_range=0.5)
    tok.save_pretrained(str(folder))
    dec = SpecDecoder.from_pretrained(specdec.load_target(folder), None,
                                      SpecConfig(verifier="target-only", max_batch_size=2, max_seq_len=96))
    ref = SpecDecoder.from_pretrained(specdec.load_target(folder), None,
                                      SpecConfig(verifier="target-only", max_batch_size=2, max_seq_len=96))
    with _serving(dec, "bpe") as (base, client):
        yield dict(base=base, tok=tok, ref=ref, client=client)


@pytest.mark.parametrize("prompt", ["ça va? 世界", "naïve 🎉", "日本語"])
def test_characters_split_across_tokens_stream_whole(bpe_server, prompt):
    """Streamed pieces joined equal the whole answer and transformers' decode of the same
    tokens: no piece ever carries half a character (which would decode as U+FFFD and never
    be repaired), streamed or not, with a multi-byte stop string too."""
    client, tok = bpe_server["client"], bpe_server["tok"]
    ids = tok(prompt)["input_ids"]
    want_ids = bpe_server["ref"].generate([ids], SamplingParams(max_new_tokens=24, ignore_eos=True))[0].token_ids
    want = tok.decode(want_ids)
    assert any(len(tok.decode([t]).encode()) != len(tok.decode([t])) or "\ufffd" in tok.decode([t]) for t in want_ids), \
        "the answer has no multi-byte pieces: the case tests nothing"
    kw = dict(model="bpe", prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
    assert whole == want and streamed == want
    chars = [c for c in want if len(c.encode()) > 1 and c != "\ufffd"]
    if chars:  # a stop string that is one multi-byte character: the text ends before it
        cut = client.completions.create(**kw, stop=[chars[0]]).choices[0]
        assert cut.text == want[: want.index(chars[0])] and cut.finish_reason == "stop"
