"""Bad input is a `ConfigError` that names the value, the expected type or range and, in a
batch, the prompt: field checks in `SamplingParams` / `SpecConfig`, request checks in
`specdec.validation.check_request` (no model needed here; the decoder-level checks are in
test_decoder_inputs.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec import ConfigError, SamplingParams, SpecConfig
from specdec.validation import check_request, model_context_length


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", "0.7", r"temperature must be a number \(int or float\), got '0.7' \(str\)"),
        ("temperature", True, r"temperature must be a number \(int or float\), got True \(bool\)"),
        ("top_p", None, r"top_p must be a number \(int or float\), got None \(NoneType\)"),
        ("top_p", float("nan"), r"top_p=nan is out of range; allowed: \(0, 1\]"),
        ("min_p", [0.1], r"min_p must be a number \(int or float\), got \[0.1\] \(list\)"),
        ("top_k", 2.0, r"top_k must be an int, got 2.0 \(float\)"),
        ("top_k", True, r"top_k must be an int, got True \(bool\)"),
        ("seed", "7", r"seed must be an int, got '7' \(str\)"),
        ("max_new_tokens", 10.0, r"max_new_tokens must be an int, got 10.0 \(float\)"),
        ("stop_token_ids", "2", r"stop_token_ids must be a token id or a list/tuple of token ids, got '2' \(str\)"),
        ("stop_token_ids", {2, 3}, r"stop_token_ids must be a token id or a list/tuple of token ids"),
        ("stop_token_ids", True, r"stop_token_ids must be a token id or a list/tuple of token ids, got True"),
        ("stop_token_ids", [2, 2.5], r"stop_token_ids entries must be token ids >= 0, got 2.5"),
        ("ignore_eos", 1, r"ignore_eos must be True or False, got 1 \(int\)"),
    ],
)
def test_sampling_params_of_the_wrong_type_say_the_expected_type(field, value, message):
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**{field: value})


def test_one_bare_stop_token_id_means_a_one_tuple_and_numbers_are_stored_as_floats():
    params = SamplingParams(stop_token_ids=5, temperature=1, top_p=1, min_p=0)
    assert params.stop_token_ids == (5,)
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
    assert type(params.temperature) is float and type(params.top_p) is float and type(params.min_p) is float


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(layers_to_capture=5), r"layers_to_capture must be a tuple of ints or None, got 5 \(int\)"),
        (dict(layers_to_capture="12"), r"layers_to_capture must be a tuple of ints or None, got '12' \(str\)"),
        (dict(plugin_options=[("eagle3", {})]), r"plugin_options must be a dict keyed by plugin name"),
        (dict(compile=1.0), r"compile=1.0 is not allowed; allowed: 'auto', 'step', True, False"),
        (dict(compile="steps"), r"compile='steps' is not allowed; allowed: 'auto', 'step', True, False"),
        (dict(cuda_graphs="on"), r"cuda_graphs='on' is not allowed"),
        (dict(max_batch_size=True), r"max_batch_size must be an int, got True \(bool\)"),
        (dict(drafter=3), r"drafter must be a non-empty strategy name, got 3"),
    ],
)
def test_spec_config_fields_of_the_wrong_type_say_the_expected_type(kw, message):
    with pytest.raises(ConfigError, match=message):
        SpecConfig(**kw)


LIMITS = dict(vocab_size=96, max_seq_len=64, max_positions=40, lookahead=6, greedy_only=False)


def check(prompt, params=None, **kw):
    check_request(prompt, params or SamplingParams(max_new_tokens=8), **{**LIMITS, **kw})


@pytest.mark.parametrize(
    "prompt, params, kw, message",
    [
        ([], None, {}, r"^prompt is empty; a request needs at least one token$"),
        ([1, 96, 2, -1], None, {}, r"^prompt token ids \[96, -1\] are out of range; allowed: \[0, 96\)$"),
        ([1, "5"], None, {}, r"^prompt token ids must be ints, got '5' \(str\) at position 1$"),
        ([1, 2.0], None, {}, r"^prompt token ids must be ints, got 2.0 \(float\) at position 1$"),
        ([1, True], None, {}, r"^prompt token ids must be ints, got True \(bool\) at position 1$"),
        ("hello", None, {}, r"^a prompt must be a list of token ids, got str$"),
        ([1], SamplingParams(top_k=10**9), {}, r"^top_k=1000000000 is out of range; allowed: \[0, 96\]"),
        ([1], SamplingParams(stop_token_ids=(3, 200)), {}, r"^stop_token_ids \[200\] are out of range; allowed: \[0, 96\)$"),
        ([1] * 20, SamplingParams(max_new_tokens=40), dict(max_positions=None),
         r"^prompt of 20 tokens \+ max_new_tokens=40 \+ 6 positions drafted ahead = 66 exceeds max_seq_len=64$"),
        ([1] * 20, SamplingParams(max_new_tokens=21), {},
         r"^prompt of 20 tokens \+ max_new_tokens=21 = 41 exceeds the model's context max_position_embeddings=40"),
        ([1], SamplingParams(temperature=0.7), dict(greedy_only=True), r"^temperature=0.7 needs a sampling verifier"),
        ([1], {"temperature": 0.7}, {}, r"^sampling must be a SamplingParams, got dict$"),
    ],
)
def test_each_request_rule_names_the_value_and_the_allowed_range(prompt, params, kw, message):
    with pytest.raises(ConfigError, match=message):
        check(prompt, params, **kw)


def test_in_a_batch_every_message_names_the_prompt_index():
    with pytest.raises(ConfigError, match=r"^prompt 3: prompt is empty"):
        check([], index=3)
    with pytest.raises(ConfigError, match=r"^prompt 0: top_k=97 is out of range"):
        check([1], SamplingParams(top_k=97), index=0)


def test_requests_at_the_limits_pass():
    check([95] * 20, SamplingParams(max_new_tokens=20, top_k=96))  # 40 positions, 46 <= 64 slots
    check([0] * 50, SamplingParams(max_new_tokens=8), max_positions=None)  # 64 = max_seq_len
    check((1, 2), SamplingParams(temperature=0.5, max_new_tokens=8))


def test_the_models_context_comes_from_its_config_else_its_hf_config_else_none():
    assert model_context_length(SimpleNamespace(config=SimpleNamespace(max_position_embeddings=8192))) == 8192
    hf_only = SimpleNamespace(config=None, hf_config=SimpleNamespace(max_position_embeddings=512))
    assert model_context_length(hf_only) == 512
    assert model_context_length(SimpleNamespace()) is None
