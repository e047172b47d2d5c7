"""Fixtures shared by the training tests (the tiny target, `train_target`, is in tests/conftest.py)."""

import pytest

from _train_tiny import make_data


@pytest.fixture(scope="module")
def data(train_target):
    """24 random prompts and the tiny target's greedy answers (a module may define its own)."""
    return make_data(train_target, n=24)
