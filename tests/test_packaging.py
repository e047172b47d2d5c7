"""The package installs whole and without setuptools warnings: an SPDX license string (not
the deprecated table), every Python package under src/specdec listed, the shipped heads as
package data of a listed package (else setuptools prints "Package would be ignored").
Checked on pyproject.toml itself; a real build is `pip wheel . --no-deps` (no warnings)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib (reading pyproject.toml) is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _package_dirs() -> dict[str, Path]:
    return {name: ROOT / path for name, path in SETUPTOOLS["package-dir"].items()}


def test_the_license_is_an_spdx_string_and_the_build_backend_accepts_it():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    requires = PYPROJECT["build-system"]["requires"]
    assert any(r.replace(" ", "").startswith("setuptools>=") and int(r.split(">=")[1].split(".")[0]) >= 77 for r in requires)


def test_every_python_package_under_the_source_tree_is_listed():
    listed = set(SETUPTOOLS["packages"])
    found = set()
    for name, folder in _package_dirs().items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    missing = sorted(found - listed)
    assert not missing, f"packages not in pyproject's [tool.setuptools] packages (not installed by a wheel): {missing}"


def test_every_shipped_asset_is_package_data_of_a_listed_package():
    data = SETUPTOOLS["package-data"]
    assets = ROOT / "src" / "specdec" / "assets"
    files = [f for f in assets.rglob("*") if f.is_file()]
    assert files
    for file in files:
        covered = False
        for package, patterns in data.items():
            if package not in SETUPTOOLS["packages"]:
                continue
            base = ROOT / "src" / Path(*package.split("."))
            if base in file.parents and any(fnmatch.fnmatch(str(file.relative_to(base)), p) for p in patterns):
                covered = True
        assert covered, f"{file.relative_to(ROOT)} is not package data of a listed package"


def test_the_repo_root_holds_no_importable_package():
    """Code run from the repo root (`python -m pytest`, the examples' imports) has the root
    first on sys.path: a package there shadows any installed one of the same name. A root
    `kernels/` did: transformers 5.25 imports Hugging Face's `kernels` and got ours."""
    import subprocess
    import sys

    packages = sorted(d.name for d in ROOT.iterdir() if d.is_dir() and (d / "__init__.py").exists())
    assert not packages, f"importable packages at the repo root shadow installed ones: {packages}"
    run = subprocess.run([sys.executable, "-c", "import transformers.integrations.hub_kernels"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
