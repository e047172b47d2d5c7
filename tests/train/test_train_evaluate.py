"""The held-out evaluation (`python -m specdec.train eval`): model-free n-gram drafting is
measured without a head, and a drafter/head mismatch is a clear error, not a silent default."""

import json

import pytest

from specdec.train import main
from specdec.train.evaluate import evaluate_head
from specdec.train.prompts import frozen_heldout_prompts

from _train_tiny import one_thread


def test_ngram_is_evaluated_without_a_head_and_stays_lossless(train_target, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    rows_file = tmp_path / "rows.json"
    argv = ["eval", "--target", str(train_target.path), "--drafter", "ngram", "--eval-prompts", "3",
            "--eval-batch-size", "2", "--eval-max-new-tokens", "24", "--json", str(rows_file)]
    with one_thread():
        assert main(argv) == 0
    rows = json.loads(rows_file.read_text())
    assert [r["name"] for r in rows] == ["target-only", "ngram chain D=8", "ngram tree D=8 K=4"]
    assert rows[0]["tau"] == 1.0
    for r in rows[1:]:
        assert r["same_as_target"] == 1.0 and r["tau"] >= 1.0
        assert r["new_tokens"] == rows[0]["new_tokens"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--drafter", "ngram", "--head", "some/folder"], "--drafter ngram takes no --head"),
        (["--drafter", "mtp"], "--drafter mtp needs --head"),
    ],
)
def test_the_command_refuses_a_head_that_does_not_fit_the_drafter(train_target, extra, message):
    with pytest.raises(SystemExit, match=message):
        main(["eval", "--target", str(train_target.path), "--eval-prompts", "1", *extra])


def test_evaluate_head_names_the_allowed_drafters_and_setups(train_target):
    prompts = frozen_heldout_prompts(1)
    with pytest.raises(ValueError, match=r"drafter='medusa' has no evaluation setups; allowed: \['eagle3', 'mtp', 'ngram'\]"):
        evaluate_head(train_target, "x", prompts, drafter="medusa")
    with pytest.raises(ValueError, match=r"unknown setups \['wide'\]; allowed: \['target', 'linear', 'tree'\]"):
        evaluate_head(train_target, None, prompts, setups=("target", "wide"), drafter="ngram")
    with pytest.raises(ValueError, match="drafter='ngram' needs no head; got head='x'"):
        evaluate_head(train_target, "x", prompts, drafter="ngram")


def test_the_shipped_prompt_sets_refuse_more_prompts_than_they_hold():
    from specdec.train.prompts import frozen_edit_prompts

    assert [p.kind for p in frozen_edit_prompts()] == ["edit"] * 3
    assert len(frozen_edit_prompts(2)) == 2
    with pytest.raises(ValueError, match=r"n=4 frozen edit prompts asked for; allowed: \[1, 3\]"):
        frozen_edit_prompts(4)
    with pytest.raises(ValueError, match=r"n=65 frozen held-out prompts asked for; allowed: \[1, 64\]"):
        frozen_heldout_prompts(65)
