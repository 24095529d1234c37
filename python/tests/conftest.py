"""Shared fixtures of the lcut package's tests.

The tests run against the installed package (``pip install ./python``) on
files of the source tree: the bundled model, the transformers reference cases
in fixtures/oracle and, when fetched, SmolLM2 (scripts/fetch-model.sh). The
parity tests also run the ``lcut`` command line (``LCUT_BIN``, else the
binary cargo built in target/). With CI=true nothing that is missing is
skipped: it fails.
"""

import os
import pathlib
import subprocess

import pytest

import lcut

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
ORACLE = FIXTURES / "oracle"
BUNDLED = FIXTURES / "models" / "copy-full"
SMOLLM2 = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
IN_CI = os.environ.get("CI") == "true"


def missing(what: str):
    """Skip a test for want of `what`, or fail it in CI."""
    if IN_CI:
        pytest.fail(f"{what} is missing (CI must have it)")
    pytest.skip(f"{what} is missing")


@pytest.fixture(scope="session")
def bundled() -> "lcut.Session":
    return lcut.load(BUNDLED)


@pytest.fixture(scope="session")
def smollm2() -> "lcut.Session":
    if not SMOLLM2.exists():
        missing(f"{SMOLLM2} (fetch it with scripts/fetch-model.sh)")
    return lcut.load(SMOLLM2, dtype="q")


@pytest.fixture(scope="session")
def lcut_bin() -> pathlib.Path:
    """The lcut command line the package is compared with."""
    candidates = [os.environ.get("LCUT_BIN")] if os.environ.get("LCUT_BIN") else []
    candidates += [REPO / "target" / "debug" / "lcut", REPO / "target" / "release" / "lcut"]
    for c in candidates:
        if c and pathlib.Path(c).is_file():
            return pathlib.Path(c)
    missing("the lcut binary (cargo build -p lcut-cli, or set LCUT_BIN)")


def run_cli(lcut_bin: pathlib.Path, *args) -> subprocess.CompletedProcess:
    """Run the lcut command line from the repository root; fail on an error."""
    out = subprocess.run(
        [str(lcut_bin), *map(str, args)], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, f"lcut {' '.join(map(str, args))}:\n{out.stdout}\n{out.stderr}"
    return out
