"""Opening checkpoint files so that a truncated or corrupt one is an error naming it.

Owns `open_safetensors` and `read_json`, used by the target loader and the draft-head
checkpoints: safetensors' own `SafetensorError: ... incomplete metadata` and json's
`JSONDecodeError` say neither which file nor what to do. Each caller passes its error
class (a `ConfigError` subclass), so the message keeps the caller's vocabulary.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

__all__ = ["open_safetensors", "read_json"]


@contextlib.contextmanager
def open_safetensors(file, error: type[Exception], *, device: str = "cpu"):
    """`safe_open(file)`; an unreadable file (truncated, not safetensors) raises `error`
    naming it. Errors while reading tensors inside the block are named the same way."""
    file = Path(file)
    try:
        with safe_open(str(file), framework="pt", device=device) as handle:
            yield handle
    except SafetensorError as e:
        raise error(
            f"{file}: cannot read this safetensors file ({e}); it is truncated or corrupt: download or save it again"
        ) from None
    except OSError as e:  # a file that vanished, a permission error
        raise error(f"{file}: cannot open ({e.strerror or e})") from None


def read_json(file, error: type[Exception]) -> dict:
    """The JSON object in `file`; invalid JSON or a non-object raises `error` naming the file."""
    file = Path(file)
    try:
        value = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{file}: not valid JSON ({e}); the file is truncated or corrupt") from None
    if not isinstance(value, dict):
        raise error(f"{file}: expected a JSON object, got {type(value).__name__}")
    return value
