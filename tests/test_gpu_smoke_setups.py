"""scripts/gpu_smoke.py --only: a partial rerun of the GPU check's smoke (short device time)
always runs target-only, the reference every other setup is compared with, and refuses a word
that names no setup instead of running nothing."""

from __future__ import annotations

import pytest

from _scripts import load_script


@pytest.fixture(scope="module")
def smoke():
    return load_script("gpu_smoke")


def test_only_runs_target_only_first_then_the_setups_named(smoke):
    assert smoke.chosen_setups(None) == list(smoke.SETUPS)
    assert smoke.chosen_setups(["TREE"]) == ["target-only", "eagle3 tree D=6 K=8 N=48", "mtp tree D=4 K=4 N=12"]
    assert smoke.chosen_setups(["eagle3 chain", "ngram"]) == ["target-only", "eagle3 chain D=5", "ngram chain D=8"]
    assert smoke.chosen_setups(["target"]) == ["target-only"]


def test_a_word_that_names_no_setup_is_refused_with_the_setups(smoke):
    with pytest.raises(SystemExit, match=r"--only medusa: names no setup; setups: target-only, eagle3 chain D=5"):
        smoke.chosen_setups(["tree", "medusa"])
