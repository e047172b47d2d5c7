"""Training judged per category (issue 14): validation loss / accuracy / estimated tau per
category in the log, early stopping on the mean over the categories, the chain estimate on
known accuracies, one curve per category in the PNG, and the estimate-vs-measured table in
TRAINING.md after a tiny pipeline run with --eval."""

import math

import pytest
import torch

from specdec.train.distill import DistillData
from specdec.train.plot import CATEGORY_TITLES, draw_training_log, read_log
from specdec.train.trainer import (
    EarlyStop, TrainConfig, ValSums, category_of_kind, summarize_validation, train_eagle3, validation_batches,
)
from specdec.train.ttt import estimated_accept_length

from _train_tiny import VOCAB, one_thread, reference_ops

KINDS = ("code", "general-chat", "math")  # code -> code-long-context
CATS = ("code-long-context", "general-chat", "math")
TINY = dict(draft_vocab_size=48, batch_tokens=256, ttt_steps=2, lr=3e-3, warmup_steps=1, log_every=1, val_every=2,
            val_fraction=0.25, val_batches=1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread, and on CPU the ops' torch references (`reference_ops`: interpreted,
    the pipeline runs' generation and evaluation prefills took minutes)."""
    with one_thread(), reference_ops():
        yield


@pytest.fixture(scope="module")
def data(train_target):
    """24 random sequences (prompt 4..15 + response 8 tokens) labelled with three kinds in turn:
    the teacher is the target's forward, so the tokens need not be its own answers (no generation, fast)."""
    gen = torch.Generator().manual_seed(0)
    plens = torch.randint(4, 16, (24,), generator=gen).tolist()
    seqs = [torch.randint(0, VOCAB, (p + 8,), generator=gen) for p in plens]
    return DistillData.pack(seqs, plens, [KINDS[i % 3] for i in range(24)])


# --------------------------------------------------------------------------- pure pieces
def test_the_chain_estimate_on_known_accuracies():
    assert estimated_accept_length([0.8, 0.5, 0.5, 0.0, 0.9]) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    assert estimated_accept_length([1.0] * 7) == pytest.approx(6.0)  # 5 drafts, then cut
    assert estimated_accept_length([0.5] * 7, depth=2) == pytest.approx(1.75)
    assert estimated_accept_length([]) == 1.0


def test_validation_summary_per_category_and_its_mean():
    sums = {"math": ValSums(loss=4.0, batches=2, correct=[8.0, 4.0], count=[10.0, 10.0]),
            "general-chat": ValSums(loss=1.0, batches=1, correct=[5.0, 0.0], count=[10.0, 10.0])}
    rec = summarize_validation(sums, step=7)
    assert rec["kind"] == "val" and rec["step"] == 7
    assert rec["categories"]["math"]["est_tau"] == pytest.approx(1 + 0.8 + 0.32)
    assert rec["categories"]["general-chat"]["est_tau"] == pytest.approx(1.5)
    assert rec["mean_est_tau"] == pytest.approx((2.12 + 1.5) / 2)
    assert rec["loss"] == pytest.approx(5.0 / 3) and rec["mean_loss"] == pytest.approx((2.0 + 1.0) / 2)
    assert rec["step_acc"] == pytest.approx([13 / 20, 4 / 20])  # pooled over categories
    with pytest.raises(ValueError, match="at least one category"):
        summarize_validation({}, 0)


def test_early_stop_counts_evaluations_without_improvement():
    es = EarlyStop(patience=2, min_delta=0.01)
    assert [es.update(v) for v in (1.0, 1.5, 1.505, 1.4, 1.6, 1.6, 1.6)] == [False, False, False, True, False, False, True]
    assert es.best == 1.6
    off = EarlyStop(patience=None)
    assert not any(off.update(1.0) for _ in range(50)) and off.bad == 49


@pytest.mark.parametrize("field, value, allowed", [("early_stop_patience", 0, "int >= 1 or None"),
                                                    ("early_stop_patience", True, "int >= 1 or None"),
                                                    ("early_stop_min_delta", -0.1, ">= 0")])
def test_early_stop_config_errors_name_the_value_and_range(field, value, allowed):
    with pytest.raises(ValueError, match=rf"{field}={value!r}.*allowed: {allowed}"):
        TrainConfig(**{field: value})


def test_validation_batches_hold_one_category_each(data):
    cfg = TrainConfig(**{**TINY, "val_batches": 8})
    groups = validation_batches(data, cfg)
    assert list(groups) == list(CATS)  # CATEGORIES order
    for cat, batches in groups.items():
        assert {category_of_kind(data.kinds[i]) for b in batches for i in b} == {cat}
    assert sorted(i for bs in groups.values() for b in bs for i in b) == list(range(len(data)))


# --------------------------------------------------------------------------- the loop
def test_the_log_reports_validation_per_category(train_target, data, tmp_path):
    log = tmp_path / "log.jsonl"
    result = train_eagle3(train_target, data, TrainConfig(max_steps=4, **TINY), work_dir=tmp_path, log_path=log, progress=False)
    val = [r for r in read_log(log) if r["kind"] == "val"]
    assert [r["step"] for r in val] == [2, 4]
    for r in val:
        assert set(r["categories"]) == set(CATS)
        for c in r["categories"].values():
            assert c["batches"] == 1 and len(c["step_acc"]) == 2
            assert c["est_tau"] == pytest.approx(estimated_accept_length(c["step_acc"])) and math.isfinite(c["loss"])
        assert r["mean_est_tau"] == pytest.approx(sum(c["est_tau"] for c in r["categories"].values()) / 3)
    assert result.last_val == val[-1] and not result.plateaued and result.steps == 4
    assert result.tokens > 0 and result.best_watched == max(r["mean_est_tau"] for r in val)
    fig = draw_training_log(read_log(log))  # the real log draws its per-category row
    assert len(fig.axes) == 4


def test_early_stopping_ends_a_plateau_and_stays_ended_on_resume(train_target, data, tmp_path):
    cfg = TrainConfig(max_steps=40, early_stop_patience=2, **{**TINY, "lr": 1e-12, "val_every": 1})  # nothing moves
    log = tmp_path / "log.jsonl"
    result = train_eagle3(train_target, data, cfg, work_dir=tmp_path, log_path=log, progress=False)
    assert result.plateaued and not result.stopped_early
    assert result.steps == 3  # best at the first evaluation, then 2 without improvement
    records = read_log(log)
    assert [r["step"] for r in records if r["kind"] == "early_stop"] == [3]
    again = train_eagle3(train_target, data, cfg, work_dir=tmp_path, log_path=log, progress=False)
    assert again.steps == 3 and again.plateaued  # a resumed plateau does not train on


# --------------------------------------------------------------------------- curves
def _records(cats):
    train = [{"kind": "train", "step": s, "loss": 2.0 / s, "step_loss": [1.0 / s, 1.0 / s], "step_acc": [0.5, 0.3],
              "est_tau": 1.65} for s in (1, 2, 3, 4)]
    val = [{"kind": "val", "step": s, "loss": 1.0, "step_acc": [0.5, 0.3], "est_tau": 1.65, "mean_est_tau": 1.6,
            "categories": {c: {"loss": 1.0, "step_acc": [0.1 * i + 0.05 * s, 0.2], "est_tau": 1.2 + 0.1 * i, "batches": 1}
                           for i, c in enumerate(cats)}} for s in (2, 4)]
    return train + val


def test_the_plot_draws_one_line_per_category():
    fig = draw_training_log(_records(CATS))
    by_title = {ax.get_title(): ax for ax in fig.axes}
    acc, tau = by_title[CATEGORY_TITLES[0]], by_title[CATEGORY_TITLES[1]]
    assert [line.get_label() for line in acc.get_lines()] == list(CATS)
    assert [line.get_label() for line in tau.get_lines()] == [*CATS, "mean (early stopping)"]
    assert list(acc.get_lines()[2].get_ydata()) == pytest.approx([0.3, 0.4])
    import matplotlib.pyplot as plt

    plt.close(fig)
    plain = draw_training_log([r for r in _records(CATS) if r["kind"] == "train"])
    assert len(plain.axes) == 2  # no categories: the two panels of before
    plt.close(plain)


# --------------------------------------------------------------------------- the record
def test_training_md_holds_estimate_vs_measured_after_a_pipeline_run_with_eval(tmp_path):
    from _chat_tokenizer import save_chat_tokenizer
    from _tiny_models import make_checkpoint

    from specdec.train import main

    folder = tmp_path / "target"  # the diverse mix needs a chat template; MTP needs no capture layers (2 layers do)
    make_checkpoint("llama", folder, num_hidden_layers=2, vocab_size=VOCAB)
    save_chat_tokenizer(folder)
    out = tmp_path / "head"
    argv = [
        "mtp", "--target", str(folder), "--out", str(out), "--work", str(tmp_path / "work"),
        "--num-prompts", "18", "--roots", "stdlib", "--data-mix", "diverse", "--mix-shares", "source=0.4,instruct=0.3,math=0.3",
        "--max-new-tokens", "6", "--max-prompt-tokens", "120", "--gen-batch-size", "8", "--draft-vocab-size", "96",
        "--steps", "2", "--batch-tokens", "512", "--ttt-steps", "2", "--log-every", "1", "--val-every", "2",
        "--early-stop-patience", "3", "--val-fraction", "0.3", "--val-prompts", "12",  # a small held-out validation set
        "--eval", "--eval-source", "categories", "--eval-prompts", "1", "--eval-setups", "linear",
        "--eval-max-new-tokens", "4", "--eval-batch-size", "8",
    ]
    assert main(argv) == 0
    record = (out / "TRAINING.md").read_text()
    assert "- categories (as in the evaluation table):" in record and "training tokens seen" in record
    assert "## Validation per category" in record and "| mean over categories |" in record
    table = record.split("## Estimated tau (training) vs measured tau (evaluation)")[1]
    assert "| category | est. tau (training) | measured tau (mtp linear D=5) | measured - estimated (chain) |" in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    val = [r for r in read_log(out / "train_log.jsonl") if r["kind"] == "val"][-1]
    for cat, v in val["categories"].items():
        assert f"| {cat} | {v['est_tau']:.2f} |" in rows[cat]
    assert "general-chat" in rows and "math" in rows and "all" in rows


# --------------------------------------------------------------------------- held-out validation data
def _tiny_pipeline_argv(folder, tmp_path, *extra):
    return [
        "mtp", "--target", str(folder), "--out", str(tmp_path / "head"), "--work", str(tmp_path / "work"),
        "--num-prompts", "18", "--roots", "stdlib", "--data-mix", "diverse", "--mix-shares", "source=0.4,instruct=0.3,math=0.3",
        "--max-new-tokens", "6", "--max-prompt-tokens", "120", "--gen-batch-size", "8", "--draft-vocab-size", "96",
        "--steps", "2", "--batch-tokens", "512", "--ttt-steps", "2", "--log-every", "1", "--val-every", "2", *extra,
    ]


def test_diverse_pipeline_validates_on_the_heldout_split_of_the_mix(tmp_path, capsys):
    from types import SimpleNamespace

    from _chat_tokenizer import save_chat_tokenizer
    from _tiny_models import make_checkpoint

    from specdec.train import main
    from specdec.train.categories import category_of, frozen_category_prompts
    from specdec.train.mix import normalize, sample_mix, split_of
    from specdec.train.pipeline import _mix_config
    from specdec.train.prompts import frozen_heldout_prompts, is_heldout, read_prompts

    folder = tmp_path / "target"
    make_checkpoint("llama", folder, num_hidden_layers=2, vocab_size=VOCAB)
    save_chat_tokenizer(folder)
    argv = _tiny_pipeline_argv(folder, tmp_path, "--val-prompts", "12")
    assert main(argv) == 0
    work, out = tmp_path / "work", tmp_path / "head"
    val_prompts = read_prompts(work / "val_prompts.jsonl")
    assert 0 < len(val_prompts) <= 12 and (work / "val_data.pt").is_file()

    def held(source):
        return split_of(source) == "heldout" if source.startswith("mix:") else is_heldout(source)

    assert all(held(p.source) for p in val_prompts)  # unseen topics / templates / source files only
    config = _mix_config(SimpleNamespace(mix_shares="source=0.4,instruct=0.3,math=0.3", roots="stdlib"))
    train_sources = {p.source for p in sample_mix(18, 0, config=config)}  # the run's training prompts (no generate needed)
    assert not {p.source for p in val_prompts} & train_sources
    frozen = {normalize(p.text) for p in frozen_category_prompts() + frozen_heldout_prompts()}
    assert not {normalize(p.text) for p in val_prompts} & frozen  # never the frozen evaluation set
    val = [r for r in read_log(out / "train_log.jsonl") if r["kind"] == "val"]
    assert val and all(set(r["categories"]) <= {category_of(p) for p in val_prompts} for r in val)
    assert {"general-chat", "math"} <= set(val[-1]["categories"])
    record = (out / "TRAINING.md").read_text()
    assert "- validation set:" in record and "HELD-OUT split" in record
    capsys.readouterr()
    assert main(argv) == 0  # a second run reuses the cached validation data
    assert f"reusing {work / 'val_data.pt'}" in capsys.readouterr().out


def test_negative_val_prompts_is_a_clear_error(tmp_path):
    from specdec.train import main

    with pytest.raises(SystemExit, match=r"--val-prompts -1 is negative; allowed: an int >= 0"):
        main(_tiny_pipeline_argv(tmp_path / "none", tmp_path, "--val-prompts", "-1"))
