"""The API as a typed contract: ``py.typed`` ships, and a user's code calling the API passes
``mypy --strict``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

USER_CODE = """
from pathlib import Path

import mtpcheck
from mtpcheck import api
from mtpcheck.testing import assert_mtp_intact, assert_mtp_preserved


def audit(path: Path) -> bool:
    report: mtpcheck.Report = api.inspect(path)
    failing: tuple[str, ...] = report.failing
    return report.ok and not failing


def compare(a: Path, b: Path) -> int:
    return len(api.diff(a, b, all_tensors=True).tensors)


def in_a_converters_tests(a: Path, b: Path) -> None:
    assert_mtp_intact(a, fetch=False)
    assert_mtp_preserved(a, b, all_tensors=True)
"""


def test_py_typed_is_package_data() -> None:
    assert (ROOT / "src" / "mtpcheck" / "py.typed").is_file()
    assert '"mtpcheck" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


def _mypy(user: Path) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` over ``user``, with this checkout's mtpcheck."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(ROOT / "src")},
        cwd=user.parent,
        timeout=600,
    )


def test_a_users_strict_type_check_of_api_calls_passes(tmp_path: Path) -> None:
    user = tmp_path / "user_code.py"
    user.write_text(USER_CODE)
    run = _mypy(user)
    assert run.returncode == 0, run.stdout + run.stderr
    # and a misuse is caught, in the API and in the testing helpers alike: the keyword is
    # all_tensors, not all_tenors
    user.write_text(USER_CODE.replace("all_tensors=True", "all_tenors=True"))
    run = _mypy(user)
    assert run.returncode == 1
    assert run.stdout.count('Unexpected keyword argument "all_tenors"') == 2, run.stdout
