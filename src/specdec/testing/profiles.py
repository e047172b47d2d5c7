"""The kit's example-count profiles, in a module of their own that imports nothing.

`kit.Context` accepts these, and `cli` offers them as ``--profile`` choices: the flags (and
`specdec check --help`) must work without hypothesis and torch, which `kit` imports.
"""

__all__ = ["PROFILES"]

PROFILES = ("ci", "gpu")  # ci: derandomized, CPU-sized example counts; gpu: many examples
