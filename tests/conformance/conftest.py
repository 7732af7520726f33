"""pytest fixtures for the natrix conformance suite.

The natrix binary is taken from $NATRIX_BIN, else <repo>/target/debug/natrix
(repo = tests/conformance/../..). If it is missing it is built once with
``cargo build -p natrix --bin natrix`` from the repo root.
"""

import functools
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import natrix_harness as h  # noqa: E402

_build_result = {}


def _ensure_binary() -> Path:
    path = h.natrix_bin_path()
    if path.exists():
        return path
    if "done" not in _build_result:
        proc = subprocess.run(
            ["cargo", "build", "-p", "natrix", "--bin", "natrix"],
            cwd=str(h.REPO_ROOT), capture_output=True, timeout=3600,
        )
        _build_result["done"] = proc
    proc = _build_result["done"]
    if not path.exists():
        pytest.fail(
            f"natrix binary not found at {path} and cargo build failed (rc={proc.returncode}):\n"
            + proc.stderr.decode(errors="replace")[-4000:],
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def natrix_bin():
    return _ensure_binary()


@pytest.fixture
def replay(natrix_bin, tmp_path):
    """replay(config_toml_text, frames) -> (outs, report); checksums of every
    output frame are verified independently."""
    return functools.partial(_replay, natrix_bin, tmp_path)


@pytest.fixture
def replay_files(natrix_bin, tmp_path):
    """replay_files(config_toml_text, frames, writer=None) -> (proc, run_dir):
    the raw run, for tests of exit status, output bytes and the report file."""
    return functools.partial(h.run_replay_files, tmp_path=tmp_path, binary=natrix_bin)


@pytest.fixture
def natrix(natrix_bin):
    """natrix(*args) -> CompletedProcess of the natrix binary."""
    return lambda *args, **kw: h.run_natrix(list(args), binary=natrix_bin, **kw)


def _replay(binary, tmp_path, config, frames, **kw):
    return h.run_replay(config, frames, tmp_path, binary=binary, **kw)


def run_replay(config_toml_text, frames, tmp_path):
    """Plain helper (as in the brief): run natrix replay and return (outs, report)."""
    return h.run_replay(config_toml_text, frames, tmp_path, binary=_ensure_binary())
