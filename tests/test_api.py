"""The Python API (``mtpcheck.inspect`` / ``diff`` / ``roundtrip`` / ``accept``) and the
assertions for a converter's tests (``mtpcheck.testing``), called directly."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import mtpcheck
from mtpcheck import CheckName, extras
from mtpcheck.formats import open_checkpoint
from mtpcheck.model.modes import DraftRule, OnlineEngine
from mtpcheck.report import renderer
from mtpcheck.testing import (
    assert_mtp_intact,
    assert_mtp_preserved,
    assert_no_findings,
    failing_findings,
)
from tests.conftest import FIXTURES, Run, flip_bit

ROOT = Path(__file__).resolve().parent.parent
DS = FIXTURES / "deepseek_v3"
PROJECTION = "model.layers.2.eh_proj.weight"


@pytest.fixture
def flipped(fixture_copy: Callable[[str], Path]) -> Path:
    """deepseek_v3 with one bit of its MTP projection flipped (row 1, column 5)."""
    damaged = fixture_copy("deepseek_v3")
    meta = open_checkpoint(damaged).tensors[PROJECTION]
    flip_bit(Path(meta.file), meta.offset + 2 * 37, bit=0)
    return damaged


def _failing(report: mtpcheck.Report) -> list[tuple[str, str, str]]:
    return [
        (check.name, f.subject, f.message)
        for check in report.checks
        for f in check.findings
        if f.status is mtpcheck.Status.FAIL
    ]


def test_inspect_returns_the_typed_report() -> None:
    report = mtpcheck.inspect(DS)
    assert isinstance(report, mtpcheck.Report)
    assert report.command == "inspect" and report.ok
    assert [i.family for i in report.inputs] == ["deepseek_v3"]
    assert assert_mtp_intact(str(DS)).ok


def test_the_cli_prints_the_report_the_api_returns(run_cli: Callable[..., Run]) -> None:
    run = run_cli("diff", DS, FIXTURES / "glm4_moe", "--format", "json")
    stream = io.StringIO()
    renderer("json").render(mtpcheck.diff(DS, FIXTURES / "glm4_moe"), stream)
    assert run.stdout == stream.getvalue()
    assert run.exit_code == (0 if json.loads(run.stdout)["ok"] else 1)


def test_diff_names_the_flipped_tensor(flipped: Path) -> None:
    report = mtpcheck.diff(DS, flipped)
    assert not report.ok
    ((check, subject, message),) = _failing(report)
    assert (check, subject) == (CheckName.TENSORS, PROJECTION)
    assert message.startswith("bits differ in 1 of 512 elements, first at index [1, 5]")
    assert mtpcheck.diff(DS, DS).ok


def test_the_assertion_lists_the_failing_findings(flipped: Path) -> None:
    with pytest.raises(AssertionError) as raised:
        assert_mtp_preserved(DS, flipped)
    message = str(raised.value)
    assert message.startswith(f"mtpcheck diff ({DS}, {flipped}): 1 failing finding(s)\n")
    assert f"  - tensors: {PROJECTION}: bits differ in 1 of 512 elements" in message
    report = mtpcheck.diff(DS, flipped)
    assert failing_findings(report) == [f"tensors: {s}: {m}" for _, s, m in _failing(report)]
    assert assert_no_findings(mtpcheck.diff(DS, DS)).ok


def test_an_unreadable_input_raises_a_path_error(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    with pytest.raises(mtpcheck.PathError) as raised:
        mtpcheck.inspect(missing)
    assert raised.value.path == str(missing)
    assert isinstance(raised.value, mtpcheck.MtpcheckError)
    with pytest.raises(mtpcheck.PathError):
        mtpcheck.diff(DS, missing)


def test_a_missing_extra_raises_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extras, "_installed", lambda module: False)
    with pytest.raises(mtpcheck.MissingExtra, match=r"mtpcheck\[convert\]"):
        mtpcheck.roundtrip(DS)


def test_accept_needs_a_checkpoint_or_a_server() -> None:
    with pytest.raises(mtpcheck.api.UsageError, match=r"Missing argument 'CKPT'"):
        mtpcheck.api.accept(None, (("chat", Path("chat.jsonl")),))


def test_modes_are_their_words() -> None:
    """str-valued enums: the JSON report and the table show the same words as before."""
    assert [m.value for m in OnlineEngine] == ["mtpcheck", "transformers"]
    assert [m.value for m in DraftRule] == ["engine", "training"]
    assert json.dumps({"draft_rule": DraftRule.TRAINING}) == '{"draft_rule": "training"}'
    assert f"{OnlineEngine.TRANSFORMERS}" == "transformers" and DraftRule("engine") == "engine"


def test_the_api_is_imported_on_first_use_and_inspect_and_diff_need_no_torch() -> None:
    code = (
        "import sys, mtpcheck\n"
        "assert 'mtpcheck.api' not in sys.modules and 'click' not in sys.modules\n"
        f"assert mtpcheck.inspect({str(DS)!r}).ok\n"
        f"mtpcheck.diff({str(DS)!r}, {str(FIXTURES / 'glm4_moe')!r})\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_every_public_name_is_exported() -> None:
    for name in mtpcheck.__all__:
        assert getattr(mtpcheck, name) is not None
    assert set(mtpcheck.__all__) <= set(dir(mtpcheck))
    assert set(mtpcheck.__all__) == {"__version__", *mtpcheck._LAZY, *mtpcheck._MODULES}
    with pytest.raises(AttributeError):
        mtpcheck.no_such_name  # noqa: B018


def test_the_documented_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/api.md's Python examples, run as shown from the repository root."""
    monkeypatch.chdir(ROOT)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), {"__name__": "docs_example"})


DAMAGING = f"{sys.executable} {ROOT / 'tests' / 'converters' / 'damaging.py'}"


def test_roundtrip_through_the_api_keeps_the_mtp_layers(tmp_path: Path) -> None:
    from mtpcheck.testing import assert_roundtrip

    report = assert_roundtrip(FIXTURES / "glm4_moe", workdir=tmp_path)
    assert report.command == "roundtrip"
    assert {CheckName.STAGE1_TENSORS, CheckName.ROUNDTRIP_TENSORS} <= {
        c.name for c in report.checks
    }
    assert list(tmp_path.iterdir()) == []  # the temporary checkpoints are gone


def test_roundtrip_through_a_converter_that_drops_mtp(tmp_path: Path) -> None:
    from mtpcheck.testing import assert_roundtrip

    to_megatron = f"{DAMAGING} drop-mtp-weights {{src}} {{dst}}"
    with pytest.raises(AssertionError) as raised:
        assert_roundtrip(FIXTURES / "glm4_moe", workdir=tmp_path, to_megatron=to_megatron)
    message = str(raised.value)
    assert (
        "stage1-tensors: mtp.layers.0.eh_proj.weight: stage 1 (HF -> Megatron): missing in "
        "Megatron output (was BF16[16, 32]) [from model.layers.2.eh_proj.weight]"
    ) in message
    assert (
        "roundtrip-tensors: model.layers.2.eh_proj.weight: stage 1 (HF -> Megatron) (as "
        "mtp.layers.0.eh_proj.weight): missing in final (was BF16[16, 32])"
    ) in message


def test_accept_through_the_api_matches_the_cli(run_cli: Callable[..., Run]) -> None:
    ckpt = FIXTURES / "accept_deepseek_v3"
    workload = ckpt / "workloads" / "in_domain.jsonl"
    report = mtpcheck.api.accept(ckpt, (("in", workload),), max_tokens=32)
    run = run_cli(
        "accept", ckpt, "--workload", f"in={workload}", "--max-tokens", "32", "--format", "json"
    )
    stream = io.StringIO()
    renderer("json").render(report, stream)
    assert run.exit_code == (0 if report.ok else 1)
    assert json.loads(stream.getvalue()) == json.loads(run.stdout)
    (result,) = report.acceptance
    assert result.workload == "in"


def test_the_api_page_says_what_each_status_means() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    rows = re.findall(r"^\| `([A-Z]+)` \| ", page, flags=re.MULTILINE)
    assert rows == [s.name for s in mtpcheck.Status]


def test_convert_through_the_api_and_back(tmp_path: Path) -> None:
    """The built-in converters as functions, the CLI's ``convert`` commands go through them."""
    megatron = mtpcheck.api.convert_hf_to_megatron(FIXTURES / "mimo", tmp_path / "meg")
    assert megatron.path == tmp_path / "meg" / "release" and megatron.files > 0
    back = mtpcheck.api.convert_megatron_to_hf(
        megatron.path.parent, tmp_path / "hf", hf_config=FIXTURES / "mimo"
    )
    assert back.path == tmp_path / "hf" and back.nbytes > 0
    assert mtpcheck.diff(FIXTURES / "mimo", back.path, all_tensors=True).ok
