"""The training loop on a tiny random target: the loss falls, checkpoints are the official
layout and reload bit for bit, a broken d2t is refused, an interrupted run resumes to the same
head, and the command line writes everything the lead copies off the GPU machine."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.drafters.eagle3_checkpoint import Eagle3CheckpointError, load_eagle3, save_eagle3
from specdec.train import main
from specdec.train.plot import read_log
from specdec.train.trainer import TrainConfig, lr_at, train_eagle3

from _train_tiny import make_data, one_thread, reference_ops

TINY = dict(draft_vocab_size=48, batch_tokens=512, lr=3e-3, warmup_steps=3, log_every=1, val_every=4,
            val_fraction=0.1, val_batches=2)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread, and on CPU the ops' torch references (`reference_ops`: interpreted,
    the pipeline's generation and evaluation prefills took minutes)."""
    with one_thread(), reference_ops():
        yield


@pytest.fixture(scope="module")
def trained(train_target, data, tmp_path_factory):
    work = tmp_path_factory.mktemp("work")
    log = work / "log.jsonl"
    result = train_eagle3(train_target, data, TrainConfig(max_steps=24, **TINY), work_dir=work, log_path=log, progress=False)
    return result, work, log


def test_a_few_training_steps_decrease_the_loss(trained):
    result, _, log = trained
    records = read_log(log)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 25)) and result.steps == 24
    first = sum(r["loss"] for r in train[:4]) / 4
    last = sum(r["loss"] for r in train[-4:]) / 4
    assert last < first - 0.05, (first, last)
    assert all(len(r["step_acc"]) == 7 and len(r["step_loss"]) == 7 for r in train)
    assert any(r["kind"] == "val" for r in records)
    assert 0.0 < result.coverage <= 1.0


def test_the_saved_checkpoint_reloads_bit_for_bit_through_the_official_loader(trained, tmp_path):
    result, work, _ = trained
    head = result.head
    assert head.config.capture_layers == (1, 3, 4) and head.config.fc_norm
    save_eagle3(head, tmp_path / "fp32")
    back = load_eagle3(tmp_path / "fp32")
    for key, value in head.state_dict().items():
        assert torch.equal(back.state_dict()[key], value.cpu()), key
    save_eagle3(head, tmp_path / "bf16", dtype=torch.bfloat16)
    back = load_eagle3(tmp_path / "bf16", dtype=torch.bfloat16)
    for key, value in head.state_dict().items():
        ref = value.to(torch.bfloat16) if value.dtype.is_floating_point else value
        assert torch.equal(back.state_dict()[key], ref.cpu()), key
    resumable = load_eagle3(work / "checkpoint")  # the trainer's own checkpoint is the official layout
    assert torch.equal(resumable.lm_head.weight, head.lm_head.weight.cpu())
    cfg = json.loads((tmp_path / "fp32" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 48


def _not_injective(d2t):
    d2t[1] = d2t[0] - 1  # draft id 1 -> the target id of draft id 0


def _out_of_range(d2t):
    d2t[-1] = 10_000


@pytest.mark.parametrize("edit, message", [(_not_injective, "not injective"), (_out_of_range, "out of range")])
def test_a_checkpoint_with_a_broken_d2t_is_refused(trained, tmp_path, edit, message):
    result, _, _ = trained
    save_eagle3(result.head, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    d2t = tensors["d2t"].clone()
    edit(d2t)
    tensors["d2t"] = d2t
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(Eagle3CheckpointError, match=message):
        load_eagle3(tmp_path)


def test_an_interrupted_run_resumes_to_the_same_head(train_target, data, tmp_path):
    cfg = TrainConfig(max_steps=6, **TINY)
    straight = train_eagle3(train_target, data, cfg, work_dir=tmp_path / "a", progress=False)
    part = train_eagle3(train_target, data, cfg, work_dir=tmp_path / "b", progress=False, stop_after=3)
    assert part.steps == 3 and part.stopped_early
    resumed = train_eagle3(train_target, data, cfg, work_dir=tmp_path / "b", progress=False)
    assert resumed.steps == 6 and not resumed.stopped_early
    for key, value in straight.head.state_dict().items():
        assert torch.equal(resumed.head.state_dict()[key], value), key
    other = make_data(train_target, n=8, seed=5)
    with pytest.raises(ValueError, match="other data"):
        train_eagle3(train_target, other, cfg, work_dir=tmp_path / "b", progress=False)


def test_the_schedule_fits_the_time_budget_after_the_slow_first_steps(train_target, data, tmp_path, monkeypatch):
    """A fake clock: steps 0-9 take 3 s, later ones 1 s; budget 60 s, 200 steps planned. The first
    fit (steps 3-7 at 3 s/step) plans 19 steps; the refit (steps 7-15, 1.75 s/step) 28, which end
    at 48 s. A fit on the first steps alone would stop at 19 steps and 39 s (on the H200 it left 30-45%
    of the budget unused)."""
    from specdec.train import trainer

    class Clock:
        t, steps = 0.0, 0

        def perf_counter(self):
            return self.t

    clock, real_collate = Clock(), trainer.collate

    def timed_collate(*args, **kwargs):
        clock.t += 3.0 if clock.steps < 10 else 1.0
        clock.steps += 1
        return real_collate(*args, **kwargs)

    monkeypatch.setattr(trainer, "time", clock)
    monkeypatch.setattr(trainer, "collate", timed_collate)
    monkeypatch.setattr(trainer, "PROBE_STEPS", 4)
    monkeypatch.setattr(trainer, "REFIT_STEPS", 8)
    cfg = TrainConfig(max_steps=200, max_minutes=1.0, **{**TINY, "val_fraction": 0.0, "val_every": 1000})
    result = train_eagle3(train_target, data, cfg, work_dir=tmp_path, progress=False)
    assert result.steps == 28 and not result.stopped_early and clock.t == 48.0
    clock.t, clock.steps = 0.0, 0
    parts = dataclasses.replace(cfg, fit_schedule=False)  # --no-fit-schedule: the budget only ends this call
    part = train_eagle3(train_target, data, parts, work_dir=tmp_path / "parts", progress=False)
    assert part.steps == 41 and part.stopped_early  # steps 0-9: 30 s, then 1 s each until past 60 s
    assert trainer.fit_steps(7, 200, 3.0, 39.0) == 19  # what the first fit alone would have run
    assert trainer.fit_steps(5, 20, 0.1, 1e6) == 20  # never past the planned schedule
    assert trainer.fit_steps(5, 20, 10.0, 1.0) == 6  # always one more step


def test_data_only_stops_after_the_data(train_target, tmp_path, capsys):
    out, work = tmp_path / "head", tmp_path / "work"
    argv = ["eagle3", "--target", str(train_target.path), "--out", str(out), "--work", str(work), "--num-prompts", "6",
            "--roots", "stdlib", "--max-new-tokens", "4", "--max-prompt-tokens", "160", "--gen-batch-size", "8",
            "--data-only"]
    assert main(argv) == 0
    assert (work / "data.pt").is_file() and (work / "prompts.jsonl").is_file() and not (work / "checkpoint").exists()
    assert not (out / "model.safetensors").exists() and "--data-only" in capsys.readouterr().out


def test_the_learning_rate_warms_up_then_decays_to_its_floor():
    cfg = TrainConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    assert [lr_at(s, 20, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, 20, cfg) == pytest.approx(1.0)
    assert lr_at(20, 20, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, 20, cfg) >= lr_at(s + 1, 20, cfg) for s in range(4, 20))
    with pytest.raises(ValueError, match="ttt_steps"):
        TrainConfig(ttt_steps=0)


def test_the_command_line_pipeline_writes_head_log_curves_record_and_eval(train_target, tmp_path, capsys):
    out = tmp_path / "head"
    argv = [
        "eagle3", "--target", str(train_target.path), "--out", str(out), "--work", str(tmp_path / "work"),
        "--num-prompts", "30", "--roots", "stdlib", "--max-new-tokens", "12", "--max-prompt-tokens", "160",
        "--gen-batch-size", "8", "--draft-vocab-size", "48", "--steps", "3", "--batch-tokens", "1024",
        "--ttt-steps", "3", "--log-every", "1", "--val-every", "2",
        "--eval", "--eval-prompts", "2", "--eval-setups", "target,linear", "--eval-max-new-tokens", "8",
    ]
    assert main(argv) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"config.json", "model.safetensors", "training_curves.png", "train_log.jsonl", "TRAINING.md", "eval.json"}
    head = load_eagle3(out, dtype=torch.bfloat16)
    assert head.config.draft_vocab_size == 48
    rows = json.loads((out / "eval.json").read_text())
    assert [r["setup"] for r in rows] == ["target", "linear"]
    assert rows[0]["tau"] == 1.0 and rows[1]["tau"] >= 1.0 and rows[1]["same_as_target"] == 1.0
    record = (out / "TRAINING.md").read_text()
    assert "python -m specdec.train eagle3" in record and "| eagle3 linear D=5 |" in record
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "reusing" not in capsys.readouterr().out
    assert main(argv[:-7]) == 0  # a second call reuses the data and the finished checkpoint
    assert "reusing" in capsys.readouterr().out
