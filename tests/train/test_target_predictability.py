"""scripts/target_predictability.py's --exit-layers: parsed before any model runs, bad values named."""
import pytest

from _scripts import load_script


def _script():
    return load_script("target_predictability")


def test_exit_layers_parse_within_the_layers_before_the_last():
    parse = _script().parse_exit_layers
    assert parse("", 30) == []
    assert parse("14, 20,28", 30) == [14, 20, 28]
    assert parse("0", 30) == [0]


@pytest.mark.parametrize("text, message", [
    ("29", r"--exit-layers \[29\] out of range; allowed: 0..28"),  # the last layer is the target itself
    ("-1,3,40", r"--exit-layers \[-1, 40\] out of range; allowed: 0..28"),
    ("a,3", r"--exit-layers='a,3' must be comma-separated integers"),
])
def test_exit_layers_out_of_range_or_not_integers_are_named(text, message):
    with pytest.raises(SystemExit, match=message):
        _script().parse_exit_layers(text, 30)
