"""Shared test setup: Triton interpreter on CPU, hypothesis profiles, device fixture.

Profiles (pick with HYPOTHESIS_PROFILE): `ci` (default; derandomized, modest, no deadline),
`dev` (random, modest), `gpu` (many examples, for a CUDA machine).
"""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Triton kernels run under the interpreter on CPU; must be set before triton is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # The tests run many tiny matmuls: OpenMP threads only add overhead, and on a loaded
    # 2-core machine oversubscription slowed them ~100x (measured). One thread is steady.
    torch.set_num_threads(1)

from hypothesis import HealthCheck, settings  # noqa: E402

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=25, derandomize=True, print_blob=True, **_common)
settings.register_profile("dev", max_examples=25, **_common)
settings.register_profile("gpu", max_examples=500, print_blob=True, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

import pytest  # noqa: E402

pytest_plugins = ["_timebox"]  # deadline and per-test report for time-boxed GPU runs


def _import_all_kernels() -> None:
    """Triton decides at `@triton.jit` time whether a kernel is interpreted: import every
    kernel now, while TRITON_INTERPRET is set, so a test that switches the ops to their
    torch references (TRITON_INTERPRET=0) cannot leave later tests with uncompilable kernels."""
    import importlib
    import pkgutil

    import specdec.kernels

    for info in pkgutil.iter_modules(specdec.kernels.__path__):
        importlib.import_module(f"specdec.kernels.{info.name}")


_import_all_kernels()


@pytest.fixture
def device() -> torch.device:
    """CUDA when present, else CPU (Triton kernels then run interpreted)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "third_party_plugin"


@pytest.fixture
def installed_example_plugin(tmp_path, monkeypatch):
    """The example package importable, with a dist-info declaring its entry point (as pip would)."""
    dist = tmp_path / "specdec_top2-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specdec-top2\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[specdec]\ntop2 = specdec_top2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN))
    sys.modules.pop("specdec_top2", None)
    yield
    sys.modules.pop("specdec_top2", None)


# ------------------------------------------------------------------ shared tiny checkpoints
# Module-scoped, as the per-file fixtures they replace were: each module builds its own copy,
# in the order its fixtures ask for them, so the global RNG (which building a checkpoint or a
# head reseeds and draws from) is where it was. Nothing here is shared between modules.


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """The real SmolLM2-135M-Instruct: (its GGUF, the converted folder). Reuses $SPECDEC_CACHE
    when set, else converts once per test session into a temporary cache that the session's
    xdist workers share (the first to ask converts, ~40 s; the others wait for it and find it
    there, instead of each converting its own copy)."""
    import fcntl

    from specdec.models import convert_gguf, smollm2_gguf_path

    gguf = smollm2_gguf_path()
    if os.environ.get("SPECDEC_CACHE"):
        return gguf, convert_gguf(gguf)
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above each worker's own (popen-gw0, popen-gw1, ...)
    root = base / "specdec_cache"
    root.mkdir(exist_ok=True)
    with open(base / "specdec_cache.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one converts; convert_gguf then hits its folder for the rest
        return gguf, convert_gguf(gguf, root=root)


@pytest.fixture(scope="module")
def tiny_llama3_with_hf(tmp_path_factory):
    """(folder, transformers model) of a tiny random Llama: `_tiny_models` defaults (3 layers,
    vocab 96, hidden 64), seed 0. The transformers model gives the reference outputs."""
    from _tiny_models import make_checkpoint

    folder = tmp_path_factory.mktemp("tiny_llama")
    return folder, make_checkpoint("llama", folder, seed=0)


@pytest.fixture(scope="module")
def tiny_llama8(tmp_path_factory) -> Path:
    """Folder of a tiny random Llama checkpoint: 8 layers, seed 3 (`_tiny_models` defaults otherwise:
    vocab 96, hidden 64). The engine suites' common target; load it with `specdec.load_target`."""
    from _tiny_models import make_checkpoint

    folder = tmp_path_factory.mktemp("llama8")
    make_checkpoint("llama", folder, num_hidden_layers=8, seed=3)
    return folder


@pytest.fixture(scope="module")
def bigram_llama(tmp_path_factory) -> Path:
    """Folder of a bigram Llama (`make_bigram_checkpoint`, seed 1): the next token depends on the
    current one only, so an oracle MTP head (`bigram_oracle_mtp()`) drafts it exactly."""
    from _mtp_heads import make_bigram_checkpoint

    folder = tmp_path_factory.mktemp("bigram")
    make_bigram_checkpoint(folder, seed=1)
    return folder


@pytest.fixture(scope="module")
def tiny_eagle3_head(tmp_path_factory) -> Path:
    """Folder of a random EAGLE-3 head for `tiny_llama8` (seed 1, capture layers (1, 3, 4), std 0.1)."""
    from _eagle3_heads import saved_tiny_head

    return saved_tiny_head(tmp_path_factory.mktemp("eagle3_head"), seed=1, capture_layers=(1, 3, 4), std=0.1)


@pytest.fixture(scope="module")
def tiny_eagle3_head_two_layers(tmp_path_factory) -> Path:
    """Folder of a random two-layer EAGLE-3 head for `tiny_llama8` (as `tiny_eagle3_head`)."""
    from _eagle3_heads import saved_tiny_head

    return saved_tiny_head(tmp_path_factory.mktemp("eagle3_head2"), seed=2, capture_layers=(1, 3, 4), std=0.1,
                           num_layers=2)


@pytest.fixture(scope="module")
def train_target(tmp_path_factory):
    """The train suites' loaded target (`_train_tiny.make_target`: tiny Llama, 8 layers, vocab 96,
    seed 0), built on one intra-op thread."""
    from _train_tiny import make_target, one_thread

    with one_thread():
        return make_target(tmp_path_factory.mktemp("train_target"))
