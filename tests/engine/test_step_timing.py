"""Step time per engine: every step counted; with phase timing on, each step split into
draft / verify / rest that add up to its total, seen by a StepObserver and by the CLI; the
output is unchanged by timing."""

from __future__ import annotations

import pytest

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.entrypoints.cli import main

from _chat_tokenizer import save_chat_tokenizer
from _eagle3_heads import saved_tiny_head
from _mtp_heads import e2e_cpu  # noqa: F401  (a fixture)
from _tiny_models import make_checkpoint

pytestmark = [pytest.mark.usefixtures("e2e_cpu"),
              pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning")]
PROMPTS = [[5, 17, 33], [71], [3, 14, 15, 92, 65]]
CONFIG = SpecConfig(drafter="eagle3", tree="dynamic", topk=2, max_draft_len=3, max_batch_size=2, max_seq_len=64,
                    kv_block_size=4)


@pytest.fixture(scope="module")
def chat_setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    make_checkpoint("llama", folder, num_hidden_layers=4, seed=3)
    save_chat_tokenizer(folder)
    head = tmp_path_factory.mktemp("head")
    saved_tiny_head(head, seed=1, capture_layers=(1, 2, 3))
    return dict(folder=folder, target=specdec.load_target(folder), head=head)


class Recorder:
    def __init__(self):
        self.seen = []

    def on_step(self, engine, accept_length):
        self.seen.append((engine.step_times.steps, engine.step_times.split_steps, engine.last_step_seconds))


def test_steps_are_counted_and_phase_timing_splits_them_without_changing_the_output(chat_setup):
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    dec = SpecDecoder.from_pretrained(chat_setup["target"], chat_setup["head"], CONFIG)
    plain = [r.token_ids for r in dec.generate(PROMPTS, params)]
    times = dec.step_times
    assert times.steps >= 10 and times.split_steps == 0 and times.seconds > 0
    assert "ms/step" in times.summary() and "phase-timed" not in times.summary()

    recorder = Recorder()
    dec.add_observer(recorder)
    dec.time_phases(True)
    before = times.steps
    timed = [r.token_ids for r in dec.generate(PROMPTS, params)]
    assert timed == plain
    assert times.split_steps == times.steps - before > 0
    assert times.draft_s > 0 and times.verify_s > 0 and times.rest_s >= 0
    assert times.draft_s + times.verify_s <= times.seconds  # the phases lie inside the steps' totals
    assert [s for s, _, _ in recorder.seen] == list(range(before + 1, times.steps + 1))  # after each hand-off
    assert all(split == s - before for s, split, _ in recorder.seen)
    assert "phase-timed" in times.summary() and "draft" in times.summary()
    dec.time_phases(False)
    split, steps = times.split_steps, times.steps
    dec.generate(PROMPTS[:1], params)
    assert times.steps > steps and times.split_steps == split  # off again: counted, not split


def test_the_command_line_prints_the_split(chat_setup, capsys):
    code = main(["generate", "--target", str(chat_setup["folder"]), "--draft", str(chat_setup["head"]), "--raw",
                 "--device", "cpu",
                 "--max-new-tokens", "6", "--ignore-eos", "--time-phases", "--no-stream", "--max-draft-len", "3",
                 "--max-seq-len", "64", "--kv-block-size", "4", "w1 w2"])
    err = capsys.readouterr().err
    assert code == 0, err
    line = next(l for l in err.splitlines() if l.startswith("specdec: steps:"))
    assert "ms/step" in line and "draft" in line and "verify" in line and "rest" in line


def test_each_steps_host_timeline_adds_up_to_its_time_per_bucket(chat_setup):
    """`StepTimes.host_split`: per (bucket, variant), the step's time split into before the
    launch / the launch / beside the device / the wait / after the hand-off (`HOST_PARTS`),
    every part >= 0, their sum the bucket's step seconds."""
    from specdec.engine.step_timing import HOST_PARTS, StepTimes

    dec = SpecDecoder.from_pretrained(chat_setup["target"], chat_setup["head"], CONFIG.replace(adaptive=True))
    dec.warmup(progress=False)
    dec.generate(PROMPTS, SamplingParams(max_new_tokens=12, ignore_eos=True))
    times = dec.engine.step_times
    assert set(times.host_split) == set(times.by_bucket) and times.host_split
    for key, (steps, seconds, _) in times.by_bucket.items():
        split = times.host_split[key]
        assert len(split) == len(HOST_PARTS) and min(split) >= 0 and sum(split) == pytest.approx(seconds, abs=1e-6), key
    with pytest.raises(ValueError, match="host has 2 parts; expected 5"):
        StepTimes().add(0.1, bucket=1, host=(0.05, 0.05))


def test_running_requests_are_summed_per_bucket_so_a_half_empty_bucket_shows(chat_setup):
    """`StepTimes.running_by_bucket`: the running requests of every step, per (bucket,
    variant); its mean is how full the bucket's steps ran (`bench_batch.py` prints it)."""
    from specdec.engine.step_timing import StepTimes

    times = StepTimes()
    times.add(0.1, bucket=4, tokens=6, running=3)
    times.add(0.1, bucket=4, tokens=2, running=1)
    times.add(0.1, bucket=1, variant="plain", tokens=1, running=1)
    assert times.running_by_bucket == {(4, "speculative"): 4, (1, "plain"): 1}
    dec = SpecDecoder.from_pretrained(chat_setup["target"], chat_setup["head"], CONFIG)
    prompts = PROMPTS * 3
    dec.generate(prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))
    times = dec.engine.step_times
    assert set(times.running_by_bucket) == set(times.by_bucket)
    for key, running in times.running_by_bucket.items():
        steps = times.by_bucket[key][0]
        assert 1 <= running / steps <= key[0], key  # at least one, at most the bucket's width
    assert sum(times.running_by_bucket.values()) >= len(prompts)
