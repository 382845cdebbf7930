"""Every ``MTPCHECK_*`` variable from one table, one policy: unset or empty is the default, a
value that does not parse is refused in one line naming the variable (exit 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtpcheck.settings import (
    DIST_TIMEOUT,
    PROGRESS_INTERVAL,
    SETTINGS,
    THREADS,
    TIMINGS,
    TORCH_THREADS,
    VLLM_VENV,
    SettingError,
)
from tests.conftest import FIXTURES

SRC = Path(__file__).resolve().parent.parent / "src" / "mtpcheck"
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize(
    ("setting", "raw", "said"),
    [
        (THREADS, "zero", "not a positive integer"),
        (THREADS, "0", "not a positive integer"),
        (TORCH_THREADS, "two", "neither a positive integer nor 'auto'"),
        (PROGRESS_INTERVAL, "soon", "not a number of seconds"),
        (PROGRESS_INTERVAL, "-1", "not a finite number of seconds, 0 or more"),
        (PROGRESS_INTERVAL, "inf", "not a finite number of seconds, 0 or more"),
        (DIST_TIMEOUT, "0", "not a number of seconds above 0"),
    ],
)
def test_a_malformed_value_is_refused_naming_the_variable(setting, raw: str, said: str) -> None:
    with pytest.raises(SettingError) as caught:
        setting.value({setting.name: raw})
    assert str(caught.value) == f"{setting.name}={raw!r}: {said}"


def test_unset_or_empty_is_the_default_and_a_value_is_read() -> None:
    for setting in SETTINGS:
        assert setting.value({}) == setting.default
        assert setting.value({setting.name: "  "}) == setting.default
    assert THREADS.value({THREADS.name: " 8 "}) == 8
    assert TORCH_THREADS.value({TORCH_THREADS.name: "AUTO"}) is None
    assert PROGRESS_INTERVAL.value({PROGRESS_INTERVAL.name: "0.5"}) == 0.5
    assert TIMINGS.value({TIMINGS.name: "t.json"}) == Path("t.json")
    assert VLLM_VENV.value({VLLM_VENV.name: "v"}) == Path("v")


def test_no_module_reads_a_variable_outside_the_table() -> None:
    """Every ``MTPCHECK_*`` name the package's code reads is one of the table's."""
    named = {s.name for s in SETTINGS}
    for module in SRC.rglob("*.py"):
        text = module.read_text()
        for found in re.findall(r"environ(?:\.get)?\(\s*[\"'](MTPCHECK_\w+)", text):
            assert found in named, (module, found)
        for found in re.findall(r"getenv\(\s*[\"'](MTPCHECK_\w+)", text):
            assert found in named, (module, found)


def test_diff_refuses_a_malformed_thread_count_in_one_line(run_cli, monkeypatch) -> None:
    monkeypatch.setenv(THREADS.name, "four")
    run = run_cli("diff", FIXTURES / "deepseek_v3", FIXTURES / "deepseek_v3")
    assert run.exit_code == 2
    assert run.stderr.strip().splitlines() == [
        "mtpcheck: error: MTPCHECK_THREADS='four': not a positive integer"
    ]


def test_the_options_page_lists_every_variable_from_the_table() -> None:
    from tests.test_docs import _hook

    hook = _hook("settings")
    page = (DOCS / hook.PAGE).read_text()
    rendered = hook.render(page)
    for setting in SETTINGS:
        assert f"| `{setting.name}` | {setting.shown_default} | {setting.doc} |" in rendered
    with pytest.raises(ValueError, match="marker"):
        hook.render(page.replace(hook.MARKER, ""))


def test_a_variable_without_a_default_is_not_read_as_one_with() -> None:
    assert THREADS.given({}) == 4
    with pytest.raises(TypeError, match="MTPCHECK_TIMINGS has no default"):
        TIMINGS.given({})
