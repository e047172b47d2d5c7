"""Capture-layer conventions: output (specdec/TRT) vs input (SGLang/vLLM) ids, and their checks."""

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from specdec.drafters.capture_conventions import (
    CaptureConventionError,
    check_capture_layers,
    checkpoint_capture_layers,
    convert_capture_layers,
    default_capture_layers,
    from_output_indices,
    to_output_indices,
)


def test_default_layers_of_a_32_layer_target_are_the_same_layers_in_both_conventions():
    assert default_capture_layers(32, "output") == (1, 15, 28)
    assert default_capture_layers(32, "input") == (2, 16, 29)
    assert to_output_indices((2, 16, 29), "input") == (1, 15, 28)


@given(L=st.integers(1, 80), data=st.data())
def test_converting_output_ids_to_input_and_back_is_the_identity(L, data):
    ids = tuple(data.draw(st.lists(st.integers(0, L - 1), min_size=1, max_size=5, unique=True)))
    note(f"L={L} ids={ids}")
    as_input = from_output_indices(ids, "input", L)
    assert all(1 <= i <= L for i in as_input)
    assert to_output_indices(as_input, "input", L) == ids
    assert convert_capture_layers(ids, src="output", dst="output", num_layers=L) == ids


def test_input_id_zero_is_the_embedding_and_is_rejected_by_value():
    with pytest.raises(CaptureConventionError, match="input-convention capture id 0 is the embedding"):
        to_output_indices((0, 5, 9), "input")


def test_out_of_range_ids_name_the_value_and_the_range():
    with pytest.raises(CaptureConventionError, match=r"layer output 12.*\[0, 12\)"):
        to_output_indices((2, 13), "input", num_layers=12)
    with pytest.raises(CaptureConventionError, match="unknown"):
        convert_capture_layers((1,), src="outputs", dst="input")


def test_official_config_ids_are_output_ids_and_speculators_ids_are_input_ids():
    official = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    speculators = {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    assert checkpoint_capture_layers(official) == (1, 15, 28)
    assert checkpoint_capture_layers(speculators) == (1, 15, 28)
    assert checkpoint_capture_layers({**official, **speculators}) == (1, 15, 28)
    assert checkpoint_capture_layers({"hidden_size": 8}) is None


def test_checkpoint_fields_that_disagree_after_conversion_are_an_error():
    both = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}, "eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    with pytest.raises(CaptureConventionError, match="disagree"):
        checkpoint_capture_layers(both)


def test_user_layers_in_the_input_convention_are_caught_with_the_converter_named():
    with pytest.raises(CaptureConventionError, match=r"'input' convention.*to_output_indices"):
        check_capture_layers((2, 16, 29), (1, 15, 28), 32)
    with pytest.raises(CaptureConventionError, match="differ from the layers"):
        check_capture_layers((3, 16, 29), (1, 15, 28), 32)
    assert check_capture_layers((28, 1, 15), (1, 15, 28), 32) == (1, 15, 28)
    assert check_capture_layers(None, (1, 15, 28), 32) == (1, 15, 28)
    assert check_capture_layers(None, None, 32) == (1, 15, 28)
    assert check_capture_layers((0, 3), None, 32) == (0, 3)
