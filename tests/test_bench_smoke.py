"""The benchmarks' CPU smoke runs finish and print their tables (the GPU runs are what they are
for; this keeps the scripts from rotting between GPU sessions): bench_cycle with two compile
modes side by side, bench_attention with two Triton launch configs side by side, bench_small_linear with cuBLAS beside
two kernel configs, bench_batch with its prefill split,
bench_e2e with a tree shape of the command line beside target-only.
`--quick` runs on the CPU (Triton interpreted, except bench_batch's transformers run: the
references) wherever it is, so on a CUDA machine (the GPU
property suite's tools part) these only repeat CI's runs, slower beside the GPU workers
(bench_cycle's alone took 217 s there): they run where there is no CUDA device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="--quick smoke runs are CPU runs: CI runs them")


def _run(*args: str, interpret: bool = True) -> str:
    """Run an example script; `interpret=False` keeps the Triton kernels off the interpreter (the
    ops' PyTorch references run: a script's table, not its kernels, is under test; bench_batch's
    transformers run went 91 -> 20 s). The kernels' own scripts (bench_attention's launch configs,
    bench_small_linear's) run them interpreted; the others time the references (bench_cycle,
    bench_batch's prefill split and bench_e2e's tree shape: ~half their CPU time went to the
    interpreter)."""
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0")
    run = subprocess.run([sys.executable, *args], cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return run.stdout


def test_bench_cycle_times_two_compile_modes_side_by_side():
    out = _run("bench_cycle.py", "--quick", "--compile", "off", "on", "--setups", "target-only", "chain-3",
               "--contexts", "32", "--steps", "4", interpret=False)
    rows = [line for line in out.splitlines() if line.startswith("| 32 |")]
    assert [r.split("|")[2].strip() for r in rows] == [
        "target-only [compile off]", "eagle3 chain 3 [compile off]", "target-only [compile on]", "eagle3 chain 3 [compile on]",
    ]
    assert rows[0].split("|")[5].strip() == "1.00"  # R against the first mode's target-only


def test_bench_attention_times_each_triton_config():
    out = _run("bench_attention.py", "--quick", "--impls", "triton", "--triton-configs", "16x4x1", "16x4x1c32m",
               "--iters", "1")
    for case in ("decode", "tree", "prefill"):
        labels = {line.split()[2] for line in out.splitlines() if line.startswith(case)}
        assert {"triton[16x4x1]", "triton[16x4x1c32m]"} <= labels, (case, labels)


def test_bench_small_linear_times_cublas_beside_each_kernel_config():
    out = _run("bench_small_linear.py", "--quick", "--configs", "8x64x2", "--iters", "1")
    rows = [line.split("|") for line in out.splitlines() if line.startswith(("| qkv |", "| down |", "| head |"))]
    assert [(r[1].strip(), r[3].strip()) for r in rows] == [(p, m) for p in ("qkv", "down", "head") for m in ("1", "3")]
    for r in rows:  # cuBLAS, the chosen config and 8x64x2, each within float32 reach of cuBLAS's output
        diffs = [float(cell.split("d ")[1].strip().rstrip(")")) for cell in r[6:8]]
        assert len(diffs) == 2 and max(diffs) < 1e-5, r
    assert "| 1 |" in out and "| 3 |" in out  # the per-forward sums


def test_bench_batch_splits_each_setups_prefill_into_target_and_head_forwards(tmp_path):
    """bench_batch's three setups at batch 1 on the never-accepting 8B stand-in: every setup
    prefills the same prompt tokens through the target; only the speculative ones run the head
    over them too (adaptive over the requests it admits with their drafter: few, the head pays nowhere); the timed forwards lie within each run's prefill time; the steps split by
    (bucket, variant) add up to the run's step time, and each one's host timeline to its time."""
    out = tmp_path / "rows.jsonl"
    text = _run("bench_batch.py", "--quick", "--targets", "8b-none", "--batch-sizes", "1", "--new-tokens", "4",
                "--repeats", "1", "--out", str(out), interpret=False)
    assert "| 8b-none | 1 |" in text
    rows = {r["kind"]: r for r in map(json.loads, out.read_text().splitlines()) if r.get("kind_row") == "row"}
    assert set(rows) == {"target-only", "fixed", "adaptive"}
    prompt_tokens = rows["target-only"]["target_tokens"]
    assert prompt_tokens > 0 and rows["target-only"]["draft_forwards"] == 0
    for kind, r in rows.items():
        assert r["target_tokens"] == prompt_tokens, kind
        if kind == "adaptive":  # a head that pays in no bucket: most requests come in without the drafter
            assert r["decisions"]["admitted_undrafted"] > 0 and r["draft_tokens"] < prompt_tokens, kind
        else:
            assert r["draft_tokens"] == (0 if kind == "target-only" else prompt_tokens), kind
        assert 0 < r["target_forward_s"] and r["target_forward_s"] + r["draft_forward_s"] <= r["prefill_s"], kind
        # the target's forwards by group shape: every forward once, batch 1 groups one chunk each
        shapes = r["target_shapes"]
        assert sum(d["forwards"] for d in shapes) == r["target_forwards"] and {d["chunks"] for d in shapes} == {1}, kind
        # the run's steps by (bucket, variant) add up to its steps and its step time
        assert sum(d["steps"] for d in r["buckets"]) >= 1, kind
        assert abs(sum(d["ms_per_step"] * d["steps"] for d in r["buckets"]) / 1e3 - r["step_s"]) < 1e-6, kind
        assert {d["variant"] for d in r["buckets"]} <= ({"speculative", "plain", "deferred", "bare"} if kind == "adaptive"
                                                        else {"speculative"}), kind
        # each step's host timeline (before launch, launch, beside the device, wait, after) is its time
        for d in r["buckets"]:
            assert min(d["host_us"].values()) >= 0 and abs(sum(d["host_us"].values()) / 1e3 - d["ms_per_step"]) < 1e-3, kind
    assert "steps per bucket: 1 " in text
    assert "a step's host timeline per bucket, us (before_launch / launch / beside_device / wait / after_handoff): 1 " in text
    assert "target prompt forwards by chunks x longest chunk: 1x" in text


def test_bench_e2e_times_a_tree_shape_given_on_the_command_line():
    """`--tree-shapes D,K,N` adds an EAGLE-3 dynamic tree of that shape as a row (exact in float32:
    its output equals target-only's); a shape out of the policy's range is refused with it."""
    out = _run("bench_e2e.py", "--quick", "--setups", "target-only", "--tree-shapes", "3,2,4", "--batch-sizes", "1",
               "--num-prompts", "2", "--new-tokens", "6", interpret=False)
    row = next(line for line in out.splitlines() if line.startswith("| specdec eagle3 tree D=3 K=2 N=4 |"))
    assert row.rstrip().endswith("| 2/2 prompts |"), row
    env = dict(os.environ, TRITON_INTERPRET="1")
    bad = subprocess.run([sys.executable, "bench_e2e.py", "--quick", "--tree-shapes", "3,2,7"], cwd=EXAMPLES, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert "--tree-shapes 3,2,7: max_total_draft_tokens=7 is out of range; allowed: [3, 6]" in bad.stderr


def test_bench_batch_times_transformers_beside_target_only(tmp_path):
    """`--setups ... transformers`: transformers' batched `generate` (static cache; compiled on a
    GPU) on the same requests, in static batches of B; the table's last column is target-only
    over it, per batch size. The 8B stand-in has no checkpoint: no row there, said so."""
    out = tmp_path / "rows.jsonl"
    text = _run("bench_batch.py", "--quick", "--targets", "smollm2", "8b-none", "--batch-sizes", "2", "--new-tokens", "4",
                "--repeats", "1", "--setups", "target-only", "fixed", "adaptive", "transformers", "--out", str(out),
                interpret=False)
    rows = [r for r in map(json.loads, out.read_text().splitlines()) if r.get("kind_row") == "row"]
    hf = [r for r in rows if r["kind"] == "transformers"]
    assert [(r["target"], r["batch"]) for r in hf] == [("smollm2", 2)]
    base = next(r for r in rows if r["kind"] == "target-only" and r["target"] == "smollm2")
    assert hf[0]["tokens"] == base["tokens"] and hf[0]["tok_s"] > 0  # the same requests, every token made
    line = next(line for line in text.splitlines() if line.startswith("| smollm2 | 2 |"))
    assert line.rstrip(" |").endswith(f"{base['tok_s'] / hf[0]['tok_s']:.2f}x")
    assert next(line for line in text.splitlines() if line.startswith("| 8b-none | 2 |")).rstrip(" |").endswith("-")
    assert "no row for 8b-none" in text


def test_bench_e2e_baseline_rows_need_their_head_folder(tmp_path):
    """The *-baseline rows time another head beside the shipped one: asked for without its folder
    (or with a folder holding no head config), bench_e2e refuses before loading anything."""
    env = dict(os.environ, TRITON_INTERPRET="1")

    def refused(*args: str) -> str:
        run = subprocess.run([sys.executable, "bench_e2e.py", *args], cwd=EXAMPLES, env=env, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
        return run.stderr

    assert "setups ['mtp-chain-baseline'] need --baseline-mtp FOLDER" in refused("--setups", "mtp-chain-baseline")
    assert "setups ['eagle3-tree-baseline'] need --baseline-eagle3 FOLDER" in refused("--setups", "eagle3-tree-baseline")
    assert f"--baseline-mtp {tmp_path}: no config.json there (a mtp head folder)" in refused("--baseline-mtp",
                                                                                               str(tmp_path))
