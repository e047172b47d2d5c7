"""Fuzzing every input a user gives: each case ends in a `ConfigError` (or a documented
subclass: `UnknownStrategyError`, `CheckpointError`, `Eagle3CheckpointError`,
`MTPCheckpointError`) or in a correct result, never another exception, and the decoders
stay usable: after each test a greedy generate still equals a fresh decoder's.

Inputs: random and malformed `SpecConfig` kwargs (then a decoder built from the valid ones,
whose greedy output must equal the target's), `SamplingParams` kwargs (valid ones then
sample through a target-only decoder), prompts (empty, out-of-vocabulary, wrong types,
tensors, conversations, too long), and draft heads (missing and extra keys, wrong shapes
and dtypes, truncated weight files, bad config values) loaded through
`SpecDecoder.from_pretrained`. Tiny targets and heads, module-scoped, ops on their torch
references (`e2e_cpu`): the file runs in about a minute on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from specdec import ConfigError, SamplingParams, SpecConfig, SpecDecoder
from specdec.drafters.mtp_checkpoint import save_mtp
from specdec.models import load_target

from _chat_tokenizer import save_chat_tokenizer
from _eagle3_heads import saved_tiny_head
from _mtp_heads import random_mtp
from _tiny_models import make_checkpoint

V = 96
PROMPT = [5, 17, 33, 2, 60]
GREEDY = SamplingParams(max_new_tokens=6, ignore_eos=True)
FINISH = {"stop", "eos", "length", "aborted", "error"}
FUZZ = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                deadline=None)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # random heads accept ~nothing (warned once)


@pytest.fixture(scope="module", autouse=True)
def torch_references():
    """As `_mtp_heads.e2e_cpu`, for the whole module: ops on their torch references, one thread."""
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "0")
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def fuzz_decoders(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz_target")
    make_checkpoint("llama", folder, num_hidden_layers=4, max_position_embeddings=128)
    save_chat_tokenizer(folder)
    target = load_target(folder)
    eagle = tmp_path_factory.mktemp("fuzz_eagle3")
    saved_tiny_head(eagle, seed=1, capture_layers=(0, 1, 2))
    mtp = tmp_path_factory.mktemp("fuzz_mtp")
    save_mtp(random_mtp(seed=2), mtp)
    base = SpecConfig(max_batch_size=3, max_seq_len=96, kv_block_size=4, compile=False, cuda_graphs=False)
    ref_dec = SpecDecoder(target, base)
    reference = ref_dec.generate([PROMPT], GREEDY)[0].token_ids
    sampler = SpecDecoder(target, base.replace(verifier="target-only"))
    return dict(target=target, heads={"eagle3": eagle, "mtp": mtp}, base=base, ref_dec=ref_dec,
                reference=reference, sampler=sampler)


def still_usable(fuzz_decoders, *decoders) -> None:
    for dec in decoders:
        assert dec.generate([PROMPT], GREEDY)[0].token_ids == fuzz_decoders["reference"]


def check_results(results, prompts_len: int, params: SamplingParams) -> None:
    assert len(results) == prompts_len
    for out in results:
        assert out.stats.finish_reason in FINISH
        if out.stats.finish_reason == "error":
            continue
        assert 1 <= len(out.token_ids) <= params.max_new_tokens
        assert all(isinstance(t, int) and 0 <= t < V for t in out.token_ids)
        stops = [i for i, t in enumerate(out.token_ids) if t in params.stop_token_ids]
        assert not stops or stops[0] == len(out.token_ids) - 1  # nothing after a stop token
        mean = out.stats.mean_accept_length
        assert mean is None or mean >= 1.0


# ------------------------------------------------------------------------------- junk
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4), st.lists(st.integers(-3, 100), max_size=4), st.tuples(st.integers(-1, 9)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.just(object()),
)


@st.composite
def valid_config_kwargs(draw, heads) -> dict:
    """Coherent values for every field this file knows (a decoder can be built from them)."""
    drafter = draw(st.sampled_from(["none", "ngram", "eagle3", "mtp"]))
    tree = draw(st.sampled_from(["linear", "dynamic"]))
    depth = draw(st.integers(1, 4))
    topk = draw(st.integers(1, 3)) if tree == "dynamic" else None
    kw = dict(
        drafter=drafter, tree=tree, max_draft_len=depth, topk=topk,
        verifier=draw(st.sampled_from(["greedy", "target-only", "speculative", "typical"])),
        max_total_draft_tokens=draw(st.one_of(st.none(), st.integers(depth, depth * (topk or 1)))),
        max_batch_size=draw(st.integers(1, 3)), max_seq_len=draw(st.integers(24, 128)),
        kv_block_size=draw(st.integers(1, 16)), num_kv_blocks=draw(st.one_of(st.none(), st.integers(4, 64))),
        prefill_chunk_size=draw(st.integers(1, 16)), kv_lookahead_steps=draw(st.integers(1, 4)),
        compile=False, cuda_graphs=draw(st.sampled_from(["auto", False])),
    )
    if drafter in ("eagle3", "mtp"):
        kw["plugin_options"] = {drafter: {"checkpoint": str(heads[drafter])}}
    return kw


BAD_CONFIG_VALUES = dict(  # each out of range, of the wrong type or incoherent with the rest
    drafter=st.sampled_from(["nope", "", 3]), tree=st.sampled_from(["bushy", None]),
    verifier=st.sampled_from(["nope", "", ["greedy"]]), max_draft_len=st.sampled_from([0, 65, 2.0, True]),
    topk=st.sampled_from([0, 65, 5]), max_total_draft_tokens=st.sampled_from([0, 10**6, -1]),
    layers_to_capture=st.sampled_from([(0, 9), (2, 2), (-1,), 5, "0,1"]), max_batch_size=st.sampled_from([0, 5000, "2"]),
    max_seq_len=st.sampled_from([1, 2, 6, 2**21]), kv_block_size=st.sampled_from([0, 10**5]),
    num_kv_blocks=st.sampled_from([0, 1, 2, -4]),
    plugin_options=st.sampled_from([[], {"ngram": {"bogus": 1}}, {"eagle3": {"checkpoint": "/no/such/head"}},
                                    {"mtp": {"checkpoint": 7}}, {"eagle3": "x"}]),
    compile=st.sampled_from([1, "on", None]), cuda_graphs=st.sampled_from([True, 0, "yes"]),
    graph_batch_sizes=st.sampled_from([(), (1,), (0, 1), "1,2"]), prefill_chunk_size=st.sampled_from([0, -3]),
    kv_lookahead_steps=st.sampled_from([0, 2000]),
)


def _spoil(draw, kw: dict, cls, bad_values: dict) -> dict:
    """`kw` with 0 to 2 fields of the dataclass `cls` spoiled: a known bad value, or any junk."""
    names = [f.name for f in dataclasses.fields(cls)]  # SpecConfig: its parts, whole, and their fields by flat name
    names = list(dict.fromkeys(names + (list(cls().flat()) if cls is SpecConfig else [])))
    for name in draw(st.lists(st.sampled_from(names), max_size=2, unique=True)):
        bad = bad_values.get(name)
        kw[name] = draw(JUNK if bad is None or draw(st.booleans()) else bad)
    return kw


@st.composite
def config_kwargs(draw, heads):
    """Valid kwargs with 0 to 2 fields spoiled (by a bad value or any junk)."""
    return _spoil(draw, draw(valid_config_kwargs(heads)), SpecConfig, BAD_CONFIG_VALUES)


def test_random_spec_configs_are_config_errors_or_decoders_whose_greedy_output_is_the_targets(fuzz_decoders):
    target = fuzz_decoders["target"]

    @FUZZ
    @given(kw=config_kwargs(fuzz_decoders["heads"]))
    def case(kw):
        note(f"kwargs={kw}")
        try:
            config = SpecConfig(**kw)
        except ConfigError:
            return
        assert config.shape.num_tree_slots == config.shape.max_total_draft_tokens + 1
        config = config.replace(compile=False)  # compiling on the CPU is slow; what it compiles is tested elsewhere
        try:
            dec = SpecDecoder(target, config)
        except ConfigError:
            return
        try:
            out = dec.generate([PROMPT], GREEDY)
        except ConfigError:  # e.g. the prompt does not fit max_seq_len
            return
        check_results(out, 1, GREEDY)
        if dec.strategies.verifier_caps.lossless:
            assert out[0].token_ids == fuzz_decoders["reference"]

    case()
    still_usable(fuzz_decoders, fuzz_decoders["ref_dec"])


# --------------------------------------------------------------------------- sampling
VALID_SAMPLING = dict(
    temperature=st.sampled_from([0.0, 0.5, 1.0, 2.0, 1]), top_k=st.sampled_from([0, 1, 5, V]),
    top_p=st.sampled_from([1.0, 0.9, 0.3]), min_p=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
    seed=st.one_of(st.none(), st.integers(0, 2**63 - 1)), max_new_tokens=st.integers(1, 8),
    stop_token_ids=st.sampled_from([(), (2,), 5, [3, 4], tuple(range(V))]), ignore_eos=st.booleans(),
)
BAD_SAMPLING = dict(
    temperature=st.sampled_from([-1.0, float("inf"), float("nan"), "0.7", True]),
    top_k=st.sampled_from([V + 1, 10**9, -1, 2.0]), top_p=st.sampled_from([0.0, 1.5, float("nan"), "1"]),
    min_p=st.sampled_from([1.1, -0.1, None]), seed=st.sampled_from([-1, 2**64, "7", 1.0]),
    max_new_tokens=st.sampled_from([0, 10**6, 3.0]), stop_token_ids=st.sampled_from([(V,), "2", (-1,), {2}, (1.0,)]),
    ignore_eos=st.sampled_from([1, "yes", None]),
)


@st.composite
def sampling_kwargs(draw):
    """Valid kwargs (for the fields this file knows) with 0 to 2 fields spoiled."""
    kw = {name: draw(values) for name, values in VALID_SAMPLING.items() if name == "max_new_tokens" or draw(st.booleans())}
    return _spoil(draw, kw, SamplingParams, BAD_SAMPLING)


def test_random_sampling_params_are_config_errors_or_valid_samples(fuzz_decoders):
    dec = fuzz_decoders["sampler"]

    @FUZZ
    @given(kw=sampling_kwargs(), batch=st.integers(1, 3))
    def case(kw, batch):
        note(f"kwargs={kw}")
        try:
            params = SamplingParams(**kw)
        except ConfigError:
            return
        try:
            out = dec.generate([PROMPT] * batch, params)
        except ConfigError:
            return
        check_results(out, batch, params)
        if params.seed is not None and batch > 1:  # a seed gives the same tokens in every row
            assert all(o.token_ids == out[0].token_ids for o in out)

    case()
    still_usable(fuzz_decoders, dec, fuzz_decoders["ref_dec"])


# ---------------------------------------------------------------------------- prompts
TOKEN = st.one_of(st.integers(0, V - 1), st.integers(0, V - 1), st.integers(-5, 2 * V), JUNK)
PROMPTS = st.one_of(
    st.lists(st.integers(0, V - 1), min_size=1, max_size=12),  # valid
    st.lists(TOKEN, max_size=8),  # empty, out of vocabulary, wrong types
    st.text(max_size=12),  # a completion (the chat tokenizer maps unknown words to <unk>)
    st.just("w1 w2 w3"),
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "", 3]),
                                    "content": st.one_of(st.text(max_size=8), st.integers())}), min_size=1, max_size=3),
    st.lists(st.dictionaries(st.sampled_from(["role", "content", "x"]), st.text(max_size=3)), min_size=1, max_size=2),
    st.integers(0, 2 * V).map(lambda n: torch.arange(n) % V),  # tensors, empty included
    st.sampled_from([torch.tensor([1.5, 2.0]), torch.ones(2, 3, dtype=torch.int64), torch.tensor([True])]),
    st.integers(60, 400).map(lambda n: [7] * n),  # too long for max_seq_len or the model's context
    JUNK,
)


def test_random_prompts_are_config_errors_naming_the_prompt_or_valid_results(fuzz_decoders):
    dec = fuzz_decoders["ref_dec"]

    @FUZZ
    @given(prompts=st.lists(PROMPTS, min_size=1, max_size=3), single=st.booleans())
    def case(prompts, single):
        arg = prompts[0] if single else prompts
        note(f"prompts={arg!r}")
        try:
            out = dec.generate(arg, GREEDY)
        except ConfigError as e:
            if not single and len(prompts) > 1 and "prompt " in str(e)[:12]:
                assert str(e).startswith("prompt ")  # a batch's error names the prompt
            return
        assert len(out) >= 1
        for o in out:
            check_results([o], 1, GREEDY)

    case()
    still_usable(fuzz_decoders, dec)


# ------------------------------------------------------------------------------ heads
def _damage(folder: Path, kind: str, how: str, seed: int) -> str:
    """Damage the head in `folder` in place; returns what was done."""
    gen = torch.Generator().manual_seed(seed)
    weights, config = folder / "model.safetensors", folder / "config.json"
    tensors = load_file(str(weights))
    keys = sorted(tensors)
    key = keys[int(torch.randint(len(keys), (1,), generator=gen))]
    if how == "drop_key":
        tensors.pop(key)
    elif how == "extra_key":
        tensors["mystery.weight"] = torch.zeros(3)
    elif how == "wrong_shape":
        t = tensors[key]
        tensors[key] = torch.zeros(*(s + 1 for s in t.shape)) if t.dim() else torch.zeros(2)
    elif how == "wrong_dtype":
        tensors[key] = tensors[key].to(torch.int32)
    elif how == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: int(len(data) * float(torch.rand(1, generator=gen)))])
        return f"{how} {weights.name}"
    elif how in ("config_value", "config_drop"):
        cfg = json.loads(config.read_text())
        field = sorted(k for k in cfg if k not in ("architectures",))[int(torch.randint(len(cfg) - 1, (1,), generator=gen))]
        if how == "config_drop":
            cfg.pop(field)
        else:
            cfg[field] = ["x", -1, 0, "1e-5", None, {"a": 1}, 10**9][int(torch.randint(7, (1,), generator=gen))]
        config.write_text(json.dumps(cfg))
        return f"{how} {field}={cfg.get(field, '<dropped>')!r}"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(weights))
    return f"{how} {key}"


def test_damaged_heads_are_config_errors_naming_the_head_or_decoders_that_stay_lossless(fuzz_decoders):
    target, heads = fuzz_decoders["target"], fuzz_decoders["heads"]

    @FUZZ
    @given(kind=st.sampled_from(["eagle3", "mtp"]),
           how=st.sampled_from(["drop_key", "extra_key", "wrong_shape", "wrong_dtype", "truncate", "config_value",
                                "config_drop"]),
           seed=st.integers(0, 2**16))
    def case(kind, how, seed):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(shutil.copytree(heads[kind], Path(tmp) / "head"))
            what = _damage(folder, kind, how, seed)
            note(f"{kind}: {what}")
            config = fuzz_decoders["base"].replace(drafter=kind)
            try:
                dec = SpecDecoder.from_pretrained(target, folder, config)
            except ConfigError as e:
                if not how.startswith("config"):  # damaged weights: the message names the head's folder or file
                    assert str(folder) in str(e), e
                return
            with contextlib.suppress(ConfigError):  # a config value the decoder refuses per request
                out = dec.generate([PROMPT], GREEDY)
                assert out[0].token_ids == fuzz_decoders["reference"]  # a head that loads is only ever slow, never wrong

    case()
    still_usable(fuzz_decoders, fuzz_decoders["ref_dec"])
