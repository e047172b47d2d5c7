"""The benchmarks' instrumentation (examples/_bench_common.py): prompt files (`--prompts`), the
implied step cost R, and the kernel-event count behind kernels/step. CPU only, no model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from _bench_common import (FilePrompt, PromptFileError, count_kernels, encode_file_prompt,  # noqa: E402
                           fmt_count, implied_step_cost, kernel_table, read_prompt_file)


def write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- formats
def test_json_list_of_strings_is_raw_text(tmp_path):
    path = write(tmp_path, "p.json", ["def fib(n):", "import os\n"])
    assert read_prompt_file(path) == [FilePrompt(text="def fib(n):"), FilePrompt(text="import os\n")]


def test_json_objects_prompt_text_and_messages(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = write(tmp_path, "p.json", [
        {"prompt": "raw"},
        {"prompt": "a question", "chat": True, "id": 7},  # other keys are ignored
        {"kind": "code", "source": "stdlib:x.py", "text": "class A:", "chat": False},
        {"messages": messages},
    ])
    got = read_prompt_file(path)
    assert got == [
        FilePrompt(text="raw"),
        FilePrompt(text="a question", chat=True),
        FilePrompt(text="class A:"),
        FilePrompt(messages=tuple(messages)),
    ]
    assert [p.is_chat for p in got] == [False, True, False, True]


def test_jsonl_reads_the_shipped_heldout_format(tmp_path):
    lines = [json.dumps({"kind": "code", "source": "s", "text": "x = 1", "chat": False}), "",
             json.dumps({"kind": "explain", "source": "s", "text": "Why?", "chat": True}), json.dumps("plain")]
    path = write(tmp_path, "p.jsonl", "\n".join(lines) + "\n")
    assert read_prompt_file(path) == [FilePrompt(text="x = 1"), FilePrompt(text="Why?", chat=True),
                                      FilePrompt(text="plain")]


def test_shipped_heldout_file_reads():
    import specdec.train.prompts as sp

    prompts = read_prompt_file(sp.FROZEN_HELDOUT)
    assert len(prompts) == len(sp.read_prompts(sp.FROZEN_HELDOUT))
    assert any(p.chat for p in prompts) and any(not p.chat for p in prompts)


def test_text_file_one_raw_prompt_per_line(tmp_path):
    path = write(tmp_path, "p.txt", "first prompt\n\n  \nsecond [not json]\n")
    assert read_prompt_file(path) == [FilePrompt(text="first prompt"), FilePrompt(text="second [not json]")]


# ----------------------------------------------------------------------------- bad input: the error names file and entry
@pytest.mark.parametrize("name, content, expected", [
    ("p.json", [], "holds no prompts (an empty list)"),
    ("p.jsonl", "\n\n", "holds no prompts"),
    ("p.txt", "  \n\n", "holds no prompts"),
    ("p.json", {"prompt": "x"}, "expected a JSON list of prompts, got a JSON dict"),
    ("p.json", "[\"a\",", "not valid JSON (line 1"),
    ("p.json", ["ok", 3], "entry 1: expected a string or an object"),
    ("p.json", ["ok", None], "entry 1: expected a string or an object"),
    ("p.json", [["a", "b"]], "entry 0: expected a string or an object"),
    ("p.json", [""], "entry 0: the prompt is an empty string"),
    ("p.json", [{"content": "x"}], "entry 0: an object needs exactly one of"),
    ("p.json", [{"prompt": "x", "messages": []}], "entry 0: an object needs exactly one of"),
    ("p.json", [{"prompt": 5}], "entry 0: \"prompt\" must be a non-empty string"),
    ("p.json", [{"prompt": "x", "chat": "yes"}], "entry 0: \"chat\" must be true or false"),
    ("p.json", [{"messages": []}], "entry 0: \"messages\" must be a non-empty list"),
    ("p.json", [{"messages": "hi"}], "entry 0: \"messages\" must be a non-empty list"),
    ("p.json", [{"messages": [{"role": "user"}]}], "entry 0: message 0 must be an object"),
    ("p.jsonl", "\"ok\"\n{broken\n", "line 2: not valid JSON"),
    ("p.jsonl", "\"ok\"\n42\n", "line 2: expected a string or an object"),
    ("p.json", b"\xff\xfe[]", "not UTF-8 text"),
])
def test_bad_file_names_file_and_problem(tmp_path, name, content, expected):
    path = write(tmp_path, name, content)
    with pytest.raises(PromptFileError) as err:
        read_prompt_file(path)
    assert str(path) in str(err.value) and expected in str(err.value), str(err.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(PromptFileError, match="no such file") as err:
        read_prompt_file(tmp_path / "nope.json")
    assert "nope.json" in str(err.value)
    with pytest.raises(PromptFileError, match="not a file"):
        read_prompt_file(tmp_path)


# ----------------------------------------------------------------------------- encoding
class FakeTokenizer:
    chat_template = "{{ messages }}"

    def __call__(self, text, add_special_tokens=True):
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_encoding_raw_chat_and_no_tokenizer():
    tok = FakeTokenizer()
    assert encode_file_prompt(FilePrompt(text="ab"), tok) == [97, 98]
    assert encode_file_prompt(FilePrompt(text="q", chat=True), tok) == [ord(c) for c in "<user>q<assistant>"]
    conv = FilePrompt(messages=({"role": "system", "content": "s"}, {"role": "user", "content": "u"}))
    assert encode_file_prompt(conv, tok) == [ord(c) for c in "<system>s<user>u<assistant>"]
    assert encode_file_prompt(FilePrompt(text="ab"), None, vocab_size=64) == [97 % 64, 98 % 64]
    assert encode_file_prompt(conv, None, vocab_size=256) == list(b"system: s\nuser: u")


def test_encoding_chat_without_template_is_an_error():
    tok = FakeTokenizer()
    tok.chat_template = None
    with pytest.raises(PromptFileError, match="prompt 3: a chat prompt, but the target's tokenizer has no chat template"):
        encode_file_prompt(FilePrompt(text="q", chat=True), tok, where="prompt 3: ")


# ----------------------------------------------------------------------------- R
def test_implied_step_cost():
    assert implied_step_cost(1.0, 1.0) == 1.0  # target-only
    assert implied_step_cost(3.0, 2.0) == pytest.approx(1.5)  # 3 tokens per step at 2x: a step costs 1.5
    assert implied_step_cost(2.0, 2.5) == pytest.approx(0.8)
    assert implied_step_cost(None, 2.0) is None  # transformers rows have no tau
    assert implied_step_cost(2.0, None) is None  # no target-only row to compare with
    assert implied_step_cost(2.0, 0.0) is None
    assert implied_step_cost(float("nan"), 1.0) is None


def test_implied_step_cost_matches_the_measured_step_ratio():
    """tok/s = tau / step time, so tau / speedup is the step-time ratio bench_cycle measures."""
    base_ms, ms, tau = 10.0, 17.0, 3.4
    speedup = (tau / ms) / (1.0 / base_ms)
    assert implied_step_cost(tau, speedup) == pytest.approx(ms / base_ms)


# ----------------------------------------------------------------------------- kernel events
def test_count_kernels_counts_kernel_records_and_graph_launches():
    from torch.autograd import DeviceType

    def ev(name, device, kind=None):
        e = SimpleNamespace(name=name, device_type=device)
        if kind is not None:
            e.activity_type = kind
        return e

    with_types = [ev("cudaGraphLaunch", DeviceType.CPU, "cuda_runtime"), ev("gemm", DeviceType.CUDA, "kernel"),
                  ev("triton_fused", DeviceType.CUDA, "kernel"), ev("Memcpy DtoH", DeviceType.CUDA, "gpu_memcpy"),
                  ev("Memset (Device)", DeviceType.CUDA, "gpu_memset"), ev("aten::mm", DeviceType.CPU, "cpu_op")]
    assert count_kernels(with_types) == (2, 1)
    without_types = [ev("cudaGraphLaunch_v10000", DeviceType.CPU), ev("gemm", DeviceType.CUDA),
                     ev("Memcpy HtoD (Pinned -> Device)", DeviceType.CUDA), ev("Memset (Device)", DeviceType.CUDA),
                     ev("Stream Sync", DeviceType.CUDA)]
    assert count_kernels(without_types) == (1, 1)
    assert [fmt_count(v) for v in (None, 12.0, 12, 12.25)] == ["-", "12", "12", "12.2"]


def test_gpu_clock_samples_parse_and_summarize(monkeypatch):
    """nvidia-smi's csv lines become (MHz, W) samples; a cut or '[N/A]' line is skipped; without
    nvidia-smi the sampler is inert and reports None."""
    from _gpu_clocks import GpuClocks, parse_samples

    text = "1980, 690.12\n1755, 700.00\n[N/A], [N/A]\n1830, 6\n19"
    assert parse_samples(text) == [(1980.0, 690.12), (1755.0, 700.0), (1830.0, 6.0)]
    clocks = GpuClocks()
    clocks.samples = parse_samples(text)
    assert clocks.summary() == dict(sm_mhz_median=1830.0, sm_mhz_min=1755.0, power_w_median=690.12, power_w_max=700.0,
                                    samples=3)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with GpuClocks() as idle:
        pass
    assert idle.summary() is None


def test_bench_batch_profile_run_prints_ops_and_python_functions(capsys):
    """`bench_batch.py --profile ROWS`: one run under torch.profiler (ops by host time) and one
    under cProfile (Python functions by own time), on any decoder with `generate`."""
    import torch
    from bench_batch import profile_run

    calls = []

    def generate(batch, params, progress=False):
        calls.append(len(batch))
        return [torch.ones(8, 8) @ torch.ones(8, 8)]

    profile_run(SimpleNamespace(generate=generate), [[1, 2], [3]], None, torch.device("cpu"), "fixed", 3)
    out = capsys.readouterr().out
    assert calls == [2, 2]
    assert "fixed: profiled run, ops by self host time" in out and "aten::mm" in out
    assert "fixed: profiled run, Python functions by own time (cProfile)" in out and "generate" in out


def test_bench_rule_host_times_both_orders():
    """examples/bench_rule_host.py: the rule's host microseconds per step, observing at once
    (all between steps) and in the engine's order (fold beside the device)."""
    from bench_rule_host import time_orders

    t = time_orders(batch=3, steps=5)
    assert set(t) == {"at once", "engine"}
    assert t["at once"][0] > 0 and t["at once"][1] == 0.0  # nothing overlapped when observing at once
    assert t["engine"][0] > 0 and t["engine"][1] > 0
    churned = time_orders(batch=3, steps=5, churn=2)  # two requests replaced a step: still timed, both orders
    assert churned["engine"][0] > 0 and churned["engine"][1] > 0


def test_bench_engine_host_times_iterations_with_the_step_stubbed(tmp_path):
    """examples/bench_engine_host.py: an engine iteration's host microseconds with every
    request running and the device step replaced by a no-op."""
    from bench_engine_host import host_us_per_iteration, tiny_target

    target = tiny_target(tmp_path)
    assert host_us_per_iteration(target, batch=2, iterations=3, repeats=2) > 0
    with pytest.raises(ValueError, match="iterations x repeats = 400"):
        host_us_per_iteration(target, batch=1, iterations=200, repeats=2)


@pytest.mark.parametrize("accept_all", [True, False])
def test_forced_verifier_bonus_is_the_argmax_at_the_last_accepted_node(accept_all):
    """bench_batch's planted verifier (8b-all / 8b-none): accept the whole chain or nothing,
    then the target's argmax at the last accepted node as the bonus, drawn through the
    library's greedy verify on a root-only tree; chains of different lengths in one batch."""
    import torch
    from bench_batch import ForcedVerifier

    from specdec.ops import build_tree

    B, N, V = 3, 5, 50
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (B, N), generator=gen)
    num_nodes = torch.tensor([5, 3, 1])
    parents = torch.where(torch.arange(N)[None] < num_nodes[:, None], torch.arange(N)[None] - 1, -1)
    tree = build_tree(parents, num_nodes)
    logits = torch.randn(B, N, V, generator=gen)
    acc = ForcedVerifier(accept_all)(tokens, tree, logits)
    length = num_nodes - 1 if accept_all else torch.zeros(B, dtype=torch.int64)
    assert acc.accept_length.tolist() == length.tolist()
    for b in range(B):
        a = int(length[b])
        assert acc.accept_nodes[b].tolist() == list(range(a + 1)) + [-1] * (N - a - 1)
        bonus = int(logits[b, a].argmax())
        assert acc.accept_tokens[b].tolist() == tokens[b, 1 : a + 1].tolist() + [bonus] + [-1] * (N - a - 1)


def test_bench_rule_replay_compares_every_policy_and_the_rule_before():
    """examples/bench_rule_replay.py: every policy on the same requests, the rule at 32cbac7
    beside today's, and the module's constants restored after the old rule ran."""
    import bench_rule_replay as bench

    from specdec.engine import adaptive

    before = (adaptive.EXPLORE_SHARE, adaptive.PRIOR_WEIGHT, adaptive.FADED)
    traces = bench.load_traces(bench.TRACES["smollm2"])
    assert len(traces) == 68 and all(0 <= a <= 5 for t in traces for a in t)
    runs = bench.compare(traces[:4], bench.PRESETS[("smollm2", 4)], batch=4, new_tokens=16, requests=8)
    assert set(runs) == {"always", "never", "no-drafter", "adaptive", "before"}
    assert {r.tokens for r in runs.values()} == {8 * 16}
    assert (adaptive.EXPLORE_SHARE, adaptive.PRIOR_WEIGHT, adaptive.FADED) == before


def test_the_kernel_table_lists_every_kernel_per_step_dearest_first():
    """bench_e2e / bench_cycle write it beside kernels/step: every kernel, not the log's top 12."""
    times = {"attn": (640.0, 72), "gemv": (1000.0, 120), "tiny": (3.0, 2)}  # us and launches over 2 steps
    table = kernel_table(times, 2)
    assert list(table) == ["gemv", "attn", "tiny"]
    assert table == {"gemv": [0.5, 60.0], "attn": [0.32, 36.0], "tiny": [0.0015, 1.0]}
    assert json.loads(json.dumps(table)) == table
    with pytest.raises(ValueError, match="steps=0"):
        kernel_table(times, 0)
