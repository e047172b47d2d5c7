"""scripts/tau_what_if.py: tau from per-depth acceptance, and the lift a target tau needs."""
import json

import pytest
from hypothesis import given, settings, strategies as st

from _scripts import load_script


def _script():
    return load_script("tau_what_if")


def test_tau_is_one_plus_the_chance_of_reaching_each_depth():
    m = _script()
    assert m.tau_from_depths([]) == 1.0
    assert m.tau_from_depths([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert m.tau_from_depths([1.0] * 5) == 6.0
    assert m.tau_from_depths([0.0, 1.0, 1.0]) == 1.0  # nothing past a depth that never accepts
    with pytest.raises(ValueError, match=r"acceptance 1.2 is out of range; allowed: \[0, 1\]"):
        m.tau_from_depths([0.5, 1.2])


@settings(max_examples=50, deadline=None)
@given(p=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), want=st.floats(1.0, 9.0))
def test_the_lift_found_is_the_smallest_step_that_reaches_the_tau(p, want):
    m = _script()
    need = m.lift_needed(p, want)
    if need is None:
        assert m.tau_from_depths([1.0] * len(p)) < want
        return
    assert m.tau_from_depths(m.lifted(p, need)) >= want
    if need > 0:
        assert m.tau_from_depths(m.lifted(p, need - 0.005)) < want


def test_lifted_caps_at_one_and_lifts_only_the_depths_asked():
    m = _script()
    assert m.lifted([0.5, 0.95, 0.2], 0.1) == pytest.approx([0.6, 1.0, 0.3])
    assert m.lifted([0.5, 0.95, 0.2], 0.1, depths=1) == pytest.approx([0.6, 0.95, 0.2])


def test_the_table_from_an_evaluation_json(tmp_path, capsys):
    rows = [
        {"setup": "target", "name": "target-only", "tau": 1.0, "tau_by_category": {"general-chat": 1.0}, "depth_acceptance": None},
        {"setup": "linear", "name": "eagle3 linear D=2", "tau": 1.7, "tau_by_category": {"general-chat": 1.7},
         "depth_acceptance": {"general-chat": {"steps": 10, "p": [0.5, 0.5]}, "all": {"steps": 10, "p": [0.5, 0.5]}}},
    ]
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(rows))
    m = _script()
    assert m.main([str(path), "--categories", "general-chat", "--lift", "0.5", "--want-chain", "2.5"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    # tau from depths 1.75; depth 1 +0.5: 1 + 1 + 0.5 = 2.5; every depth: 3.0; the lift is sought for 2.5 plus the
    # product's 0.05 over the measured tau
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:6] == ["eagle3 linear D=2", "general-chat", "1.70", "1.75", "2.50", "3.00"]
    need = float(cells[6].split()[0])
    assert m.tau_from_depths(m.lifted([0.5, 0.5], need)) >= 2.55 > m.tau_from_depths(m.lifted([0.5, 0.5], need - 0.005))
    with pytest.raises(SystemExit, match="category 'math' is not in"):
        m.main([str(path), "--categories", "math"])
