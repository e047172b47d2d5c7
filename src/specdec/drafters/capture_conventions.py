"""Capture-layer index conventions, and explicit converters between them.

Engines number the captured target layers differently, and checkpoint configs store
either numbering. The same three layers of a 32-layer model are:

- ``"output"`` (specdec, TensorRT-LLM; the seed): index l = what decoder layer l *returns*
  (residual included). Default ``(1, L//2 - 1, L - 4)`` -> ``(1, 15, 28)``.
- ``"input"`` (SGLang and vLLM at run time): index l = what decoder layer l *receives*, i.e.
  the output of layer l - 1 (input 0 would be the embeddings). Default
  ``(2, L//2, L - 3)`` -> ``(2, 16, 29)``; input L is the last layer's output.

Where a checkpoint stores its ids (`CHECKPOINT_LAYER_FIELDS`):

- official SafeAILab / SpecForge layout: ``eagle_config.eagle_aux_hidden_state_layer_ids``,
  in the *output* convention (SGLang adds 1 when reading it);
- vLLM "speculators" layout (and third-party converters): top-level
  ``eagle_aux_hidden_state_layer_ids``, in the *input* convention (vLLM uses it as given).

Everything inside specdec (`SpecConfig.layers_to_capture`, the `specdec_capture_layers`
hook, `CaptureBuffer.layers`) is in the output convention. This module owns the
conversions and the check that catches ids given in the other convention; it knows
nothing of weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specdec.errors import ConfigError

__all__ = [
    "CONVENTIONS",
    "CHECKPOINT_LAYER_FIELDS",
    "CaptureConventionError",
    "convert_capture_layers",
    "to_output_indices",
    "from_output_indices",
    "default_capture_layers",
    "checkpoint_capture_layers",
    "check_capture_layers",
]

CONVENTIONS = {
    "output": "index l = output of decoder layer l (specdec, TensorRT-LLM)",
    "input": "index l = input of decoder layer l = output of layer l-1 (SGLang, vLLM)",
}

# checkpoint config field -> convention its ids are stored in
CHECKPOINT_LAYER_FIELDS = {
    "eagle_config.eagle_aux_hidden_state_layer_ids": "output",  # SafeAILab / SpecForge
    "eagle_aux_hidden_state_layer_ids": "input",  # vLLM speculators, vLLM runtime field
}


class CaptureConventionError(ConfigError):
    """Capture-layer ids that are out of range, inconsistent, or in another convention."""


def _check_convention(name: str, convention: str) -> None:
    if convention not in CONVENTIONS:
        raise CaptureConventionError(f"{name}={convention!r} is unknown; allowed: {sorted(CONVENTIONS)}")


def _as_ids(ids: Sequence[int], what: str) -> tuple[int, ...]:
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise CaptureConventionError(f"{what} must be ints, got {i!r} in {tuple(ids)}")
        out.append(i)
    return tuple(out)


def convert_capture_layers(
    ids: Sequence[int], *, src: str, dst: str, num_layers: int | None = None
) -> tuple[int, ...]:
    """Convert capture-layer ids between conventions ("output" <-> "input"), keeping order.

    Args:
        ids: layer ids in convention `src`.
        src, dst: a key of `CONVENTIONS`.
        num_layers: the target's L; when given, the result is checked to lie in range
            (output: [0, L), input: [1, L]).
    Raises:
        CaptureConventionError: input id 0 (the embeddings: not a layer output) or an id
            out of range, naming the value.
    """
    _check_convention("src", src)
    _check_convention("dst", dst)
    ids = _as_ids(ids, f"capture layer ids ({src} convention)")
    if src == "input":
        bad = [i for i in ids if i < 1]
        if bad:
            raise CaptureConventionError(
                f"input-convention capture id {bad[0]} is the embedding output, not a decoder layer's output; "
                f"specdec captures layer outputs only (allowed input ids: >= 1), got {ids}"
            )
        out = tuple(i - 1 for i in ids)
    else:
        bad = [i for i in ids if i < 0]
        if bad:
            raise CaptureConventionError(f"output-convention capture id {bad[0]} is negative; got {ids}")
        out = ids
    if num_layers is not None:
        bad = [i for i in out if i >= num_layers]
        if bad:
            raise CaptureConventionError(
                f"capture ids {ids} ({src} convention) name layer output {bad[0]}, out of range for a target "
                f"with {num_layers} layers (allowed output ids: [0, {num_layers}))"
            )
    return out if dst == "output" else tuple(i + 1 for i in out)


def to_output_indices(ids: Sequence[int], convention: str, num_layers: int | None = None) -> tuple[int, ...]:
    """Ids in `convention` -> specdec's output convention."""
    return convert_capture_layers(ids, src=convention, dst="output", num_layers=num_layers)


def from_output_indices(ids: Sequence[int], convention: str, num_layers: int | None = None) -> tuple[int, ...]:
    """specdec's output-convention ids -> `convention`."""
    return convert_capture_layers(ids, src="output", dst=convention, num_layers=num_layers)


def default_capture_layers(num_layers: int, convention: str = "output") -> tuple[int, ...]:
    """The EAGLE-3 default in `convention`: output (1, L//2-1, L-4) == input (2, L//2, L-3)."""
    from specdec.config import resolve_capture_layers

    return from_output_indices(resolve_capture_layers(num_layers, None), convention)


def _field(config: Mapping, dotted: str):
    value = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def checkpoint_capture_layers(config: Mapping, *, source: str = "config.json") -> tuple[int, ...] | None:
    """The capture layers a draft checkpoint's config stores, in the output convention.

    Reads every field of `CHECKPOINT_LAYER_FIELDS` (and the same fields nested in a
    speculators ``speculators_config``); converts each by its convention. If several are
    present they must name the same layers. Returns None when none is present.

    Raises:
        CaptureConventionError: fields that disagree after conversion, naming both.
    """
    found: dict[str, tuple[int, ...]] = {}
    for dotted, convention in CHECKPOINT_LAYER_FIELDS.items():
        value = _field(config, dotted)
        if value is None:
            continue
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise CaptureConventionError(f"{source}: {dotted}={value!r} must be a list of layer ids")
        found[dotted] = to_output_indices(list(value), convention)
    if not found:
        return None
    distinct = set(found.values())
    if len(distinct) > 1:
        detail = ", ".join(f"{k}={list(_field(config, k))} ({CHECKPOINT_LAYER_FIELDS[k]}) -> output {v}" for k, v in found.items())
        raise CaptureConventionError(f"{source}: capture-layer fields disagree: {detail}")
    return next(iter(distinct))


def check_capture_layers(
    given: Sequence[int] | None,
    expected: Sequence[int] | None,
    num_layers: int,
    *,
    expected_source: str = "the draft checkpoint",
) -> tuple[int, ...]:
    """Reconcile user-given capture layers (output convention) with a checkpoint's.

    Returns the layers to capture (output convention, ascending): `expected` when `given`
    is None, `given` when `expected` is None, else both must match.

    Raises:
        CaptureConventionError: a mismatch; when `given` equals `expected` in the input
            convention (ids one too high), the message says so and names the converter.
    """
    from specdec.config import resolve_capture_layers

    if expected is not None:
        expected = tuple(sorted(expected))
        resolve_capture_layers(num_layers, expected)  # range check: [0, L)
    if given is None:
        return resolve_capture_layers(num_layers, expected)
    given = tuple(sorted(_as_ids(given, "layers_to_capture")))
    if expected is None or given == expected:
        return resolve_capture_layers(num_layers, given)
    as_input = from_output_indices(expected, "input")
    if given == as_input:
        raise CaptureConventionError(
            f"layers_to_capture={given} look like {expected_source}'s layers {expected} written in the 'input' "
            "convention (SGLang/vLLM count layer inputs); specdec counts layer outputs. Pass "
            f"to_output_indices({list(given)}, 'input') = {expected}, or leave layers_to_capture=None"
        )
    raise CaptureConventionError(
        f"layers_to_capture={given} (output convention) differ from the layers {expected_source} was trained "
        f"on, {expected}; leave layers_to_capture=None to use them"
    )
