"""README.md and the documentation site (docs/) against the code they describe.

The families tables are built from the registry by docs/hooks/families.py; relative links
must point at files; the ``console`` examples that run on the shipped fixtures and test data
must show what the command really prints.
"""

from __future__ import annotations

import html
import importlib.util
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

from mtpcheck.families import FAMILIES, MtpFamily

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])


def _hook(name: str = "families") -> ModuleType:
    """The MkDocs hook ``docs/hooks/NAME.py``, loaded as a module."""
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / "hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _hook()
DRAFTERS_HOOK = _hook("drafters")


def test_the_drafters_page_gets_a_row_per_kind_in_both_tables() -> None:
    from mtpcheck.families.drafter_kinds import DRAFTER_KINDS

    page = (DOCS / DRAFTERS_HOOK.PAGE).read_text()
    rendered = DRAFTERS_HOOK.render(page)
    for table in (DRAFTERS_HOOK.kinds_table(), DRAFTERS_HOOK.engines_table()):
        assert table in rendered
        keys = re.findall(r"^\| `([\w-]+)`", table, re.M)
        assert keys == [k.key for k in DRAFTER_KINDS]
    with pytest.raises(ValueError, match="marker"):
        DRAFTERS_HOOK.render(page.replace(DRAFTERS_HOOK.ENGINES_MARKER, ""))


def test_the_convert_page_gets_a_row_per_megatron_writer() -> None:
    """Every family the built-in converter writes, and every one it refuses with a reason, has
    its row in the generated table, with the layout its record names."""
    hook = _hook("writers")
    page = (DOCS / hook.PAGE).read_text()
    rendered = hook.render(page)
    assert hook.MARKER not in rendered and hook.writers_table() in rendered
    rows = dict(re.findall(r"^\| .*? \(`(\w+)`\) \| (.*?) \|", hook.writers_table(), re.M))
    for f in FAMILIES:
        if f.support.writer is not None:
            assert rows[f.key] == f"`{f.support.writer.layout}`", f.key
        elif f.support.no_writer:
            assert rows[f.key] == "not written", f.key
        else:
            assert f.key not in rows
    with pytest.raises(ValueError, match="marker"):
        hook.render("no marker here")


def test_the_server_page_gets_a_row_per_serving_engine() -> None:
    """Every engine ``accept --server`` reads has its row, with every metric name it reads."""
    from mtpcheck.accept.server_engines import ENGINES

    hook = _hook("engines")
    page = (DOCS / hook.PAGE).read_text()
    rendered = hook.render(page)
    assert hook.MARKER not in rendered and hook.engines_table() in rendered
    rows = re.findall(r"^\| .*? \(`(\w+)`\) \|(.*)$", hook.engines_table(), re.M)
    assert [key for key, _ in rows] == list(ENGINES)
    for (key, cells), engine in zip(rows, ENGINES.values(), strict=True):
        c = engine.counters
        read = () if c is None else (c.draft_tokens, c.accepted_tokens, c.traffic)
        for name in (*read, engine.metric_prefix, engine.per_request_field):
            assert name in cells, (key, name)
    with pytest.raises(ValueError, match="marker"):
        hook.render("no marker here")


# --- the families tables -----------------------------------------------------------------------


def _rows(table: str) -> dict[str, list[str]]:
    """Cells by family key, Markdown escapes undone."""
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [html.unescape(re.sub(r"\\(.)", r"\1", c)) for c in line.strip("|").split(" | ")]
        cells = [c.strip() for c in cells]
        rows[cells[0].strip("`")] = cells
    return rows


def _backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _assert_row(f: MtpFamily, cells: list[str]) -> None:
    key, checkpoints, count, where, specific, copies, concat, writer, mapped, accept, notes = cells
    assert key == f"`{f.key}`"
    assert f.display in checkpoints
    assert _backticked(checkpoints) == list(f.model_types)
    assert _backticked(count) == list(f.count.keys)
    assert count.endswith("(undeclared)" if f.count.default is None else f"({f.count.default})")
    if f.layout.specific:
        assert f.layout.layer_prefix in _backticked(where)
    # each MTP-only tensor shown, in order, relative to the layer
    for name, template in zip(_backticked(specific), f.layout.specific, strict=True):
        assert template.removesuffix(".weight").endswith(name), (name, template)
    if f.layout.copies and f.layout.copy_policy.value != "none":
        assert copies.endswith(f"({f.layout.copy_policy.value})")
        for name, copy in zip(_backticked(copies), f.layout.copies, strict=True):
            assert copy.template.removesuffix(".weight").endswith(name)
    else:
        assert copies == "none"
    assert concat == f.layout.concat_order.value
    assert writer.startswith("yes") == (f.support.writer is not None)
    if f.support.writer is not None:
        assert writer.endswith(f"{f.support.writer.spec} spec")
    assert mapped == ("yes" if f.megatron is not None else "no")
    assert accept.startswith("yes") == f.support.accept.measurable
    assert f.support.accept.why_not in accept
    assert notes == f.notes


def test_the_families_tables_hold_every_registered_family_as_the_registry_has_it() -> None:
    models = _rows(HOOK.families_table())
    formats = _rows(HOOK.families_table(HOOK.FORMAT_FAMILIES))
    assert not set(models) & set(formats)
    assert list(models) + list(formats) == [
        f.key for f in FAMILIES if f not in HOOK.FORMAT_FAMILIES
    ] + [f.key for f in HOOK.FORMAT_FAMILIES]
    for f in FAMILIES:
        _assert_row(f, {**models, **formats}[f.key])


def test_the_families_page_gets_both_tables() -> None:
    page = (DOCS / HOOK.PAGE).read_text()
    rendered = HOOK.render(page)
    assert HOOK.MODEL_MARKER not in rendered and HOOK.FORMAT_MARKER not in rendered
    assert HOOK.families_table() in rendered
    assert HOOK.families_table(HOOK.FORMAT_FAMILIES) in rendered
    with pytest.raises(ValueError, match="marker"):
        HOOK.render(page.replace(HOOK.FORMAT_MARKER, ""))


def test_the_verified_against_table_lists_exactly_the_mapped_families() -> None:
    page = (DOCS / HOOK.PAGE).read_text()
    section = page.split("## Megatron mapping verified against", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert listed == sorted(listed, key=[f.key for f in FAMILIES].index)  # registry order
    assert set(listed) == {f.key for f in FAMILIES if f.megatron is not None}


# --- links -------------------------------------------------------------------------------------


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(page: Path) -> None:
    for link in _links(page):
        if re.match(r"https?://|#|mailto:", link):
            continue
        target = (page.parent / link.split("#", 1)[0]).resolve()
        assert target.is_file(), f"{page.relative_to(ROOT)}: {link}"
        if page.is_relative_to(DOCS):  # the site is built from docs/ alone
            assert target.is_relative_to(DOCS), f"{page.relative_to(ROOT)}: {link}"


def test_readme_keeps_the_test_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text().split("# README's test command, verbatim", 1)[1]
    command = next(line for line in ci.splitlines()[1:] if line.startswith("python3 -m venv"))
    assert command in (ROOT / "README.md").read_text().splitlines()


# --- console examples on the shipped fixtures --------------------------------------------------


def _examples() -> dict[tuple[str, ...], list[tuple[str, list[str]]]]:
    """Every ``console`` example running mtpcheck on the shipped fixtures or test data: (where,
    shown output) by command, so a command shown on several pages runs once."""
    found: dict[tuple[str, ...], list[tuple[str, list[str]]]] = {}
    for page in PAGES:
        for block in re.findall(r"```console\n(.*?)```", page.read_text(), re.S):
            lines = block.rstrip("\n").split("\n")
            command = lines.pop(0)
            while command.endswith("\\"):
                command = command[:-1] + lines.pop(0)
            if " | " in command:
                continue  # a pipeline: its output is not mtpcheck's
            argv = shlex.split(command.removeprefix("$ "))
            if argv[0] != "mtpcheck" or not argv[2].startswith(("fixtures/", "tests/data/")):
                continue  # not on shipped files (a Hub repository, a path of yours)
            found.setdefault(tuple(argv[1:]), []).append((str(page.relative_to(ROOT)), lines))
    return found


EXAMPLES = _examples()


def _own_python(argv: tuple[str, ...]) -> list[str]:
    """A converter command's ``python`` as the interpreter running the tests."""
    return [re.sub(r"^python ", f"{shlex.quote(sys.executable)} ", a) for a in argv]


def _chunks(shown: list[str]) -> list[list[str]]:
    """The shown output split at its ``...`` lines."""
    chunks: list[list[str]] = [[]]
    for line in shown:
        if line == "...":
            chunks.append([])
        else:
            chunks[-1].append(line)
    return [c for c in chunks if c]


def _assert_shown(where: str, shown: list[str], printed: list[str], exit_code: int) -> None:
    at = 0
    chunks = _chunks(shown)
    for n, chunk in enumerate(chunks):  # each run of lines between `...` printed as shown, in order
        starts = [i for i in range(at, len(printed)) if printed[i : i + len(chunk)] == chunk]
        assert starts, f"{where}: not printed (after line {at}):\n" + "\n".join(chunk)
        if n == 0 and shown[0] != "...":
            assert starts[0] == 0, f"{where}: lines left out before the first, no `...`"
        at = starts[0] + len(chunk)
    if chunks and shown[-1] != "...":
        assert at == len(printed), f"{where}: lines left out after the last, no `...`"
    if any(line.startswith("verdict: ") for line in shown):
        assert exit_code == (0 if "verdict: PASS" in shown else 1), where


def test_the_examples_are_found() -> None:
    pages = {where for shown in EXAMPLES.values() for where, _ in shown}
    assert {"README.md", "docs/commands/inspect.md", "docs/round-trip.md"} <= pages
    assert len(EXAMPLES) >= 10


def test_a_changed_line_is_caught() -> None:
    printed = ["a", "b", "c", "verdict: PASS"]
    _assert_shown("ok", ["a", "...", "c", "verdict: PASS"], printed, 0)
    # a gap unmarked, order, a change, lines left out at the start or the end unmarked
    for shown in (["a", "c"], ["c", "...", "a"], ["b", "x"], ["b", "c", "verdict: PASS"],
                  ["a", "b"]):  # fmt: skip
        with pytest.raises(AssertionError):
            _assert_shown("bad", shown, printed, 0)
    with pytest.raises(AssertionError):
        _assert_shown("exit code", ["verdict: PASS"], printed, 1)


def _example_id(argv: tuple[str, ...]) -> str:
    return " ".join([*argv[:2], *(a for a in argv[2:] if a.startswith("--") and a != "--workload")])


@pytest.mark.parametrize("argv", list(EXAMPLES), ids=_example_id)
def test_console_example_shows_what_the_command_prints(
    argv: tuple[str, ...], run_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "--online-engine" in argv:
        import transformers

        from tests.test_accept_online_transformers import PINNED

        if transformers.__version__ != PINNED:
            pytest.skip(f"transformers' own counts are shown as on {PINNED}")
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("COLUMNS", raising=False)  # the width a log gets by default
    run = run_cli(*_own_python(argv))
    printed = [line.rstrip() for line in run.stdout.splitlines()]
    for where, shown in EXAMPLES[argv]:
        _assert_shown(where, shown, printed, run.exit_code)
