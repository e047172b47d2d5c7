"""`compile_scope`: private compiled copies, and the Inductor options a block hands to them
(`ExecutionConfig.combo_kernels` reaches a decoder's pieces this way)."""

import pytest
import torch

from specdec import SpecConfig
from specdec.compile_scope import PIECE_OPTIONS, compile_private, inductor_options, private_copy
from specdec.config import ConfigError


def test_inductor_options_reach_only_the_compiles_inside_the_block(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    with inductor_options(combo_kernels=True):
        compile_private(lambda x: x, dynamic=True)
        compile_private(lambda x: x, options={"max_autotune": False})
    compile_private(lambda x: x)
    base = PIECE_OPTIONS  # every piece's own
    assert seen == [dict(dynamic=True, options={**base, "combo_kernels": True}),
                    dict(options={**base, "combo_kernels": True, "max_autotune": False}), dict(options=base)]


def test_a_private_copy_runs_the_same_code_under_its_own_code_object():
    def f(x, y=2):
        return x * y

    g = private_copy(f)
    assert g(3) == f(3) == 6 and g.__code__ is not f.__code__ and g.__qualname__ == f.__qualname__


def test_combo_kernels_is_a_bool_knob_of_the_execution_part():
    assert SpecConfig(combo_kernels=True).execution.combo_kernels is True
    with pytest.raises(ConfigError, match=r"combo_kernels='yes' is not allowed; allowed: True, False"):
        SpecConfig(combo_kernels="yes")
