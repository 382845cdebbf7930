"""The composite GitHub Action (action.yml), read with a YAML parser and run as the runner runs
it: each ``run:`` step whose ``if:`` holds, in order, as ``bash --noprofile --norc -eo pipefail``,
with its ``env:`` expressions filled from the inputs, its own ``GITHUB_STEP_SUMMARY`` file and
``GITHUB_ACTION_PATH``, stopping at the first step that fails. Only ``uses:`` (setup-python)
and the install step are left out: the test's interpreter, which has mtpcheck installed, stands
in for them (its folder is put first on PATH)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtpcheck import CheckName
from tests.conftest import FIXTURES, write_safetensors
from tests.hub_server import FakeHub, HubServer

ROOT = Path(__file__).resolve().parent.parent
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
INPUTS: dict[str, dict[str, Any]] = ACTION["inputs"]
STEPS: list[dict[str, Any]] = ACTION["runs"]["steps"]
BIN = Path(sys.executable).parent  # .venv/bin: where `pip install -e .` put `mtpcheck`
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


# --- the runner, as far as this action uses it ------------------------------------------------


def _inputs(**given: str) -> dict[str, str]:
    """The inputs a step sees: the defaults of action.yml, then the ones a workflow gives."""
    names = {name.replace("_", "-"): value for name, value in given.items()}
    assert set(names) <= set(INPUTS), set(names) - set(INPUTS)
    values = {name: str(spec.get("default", "")) for name, spec in INPUTS.items()}
    values.update(names)
    for name, spec in INPUTS.items():
        assert not spec.get("required") or values[name], f"input {name} is required"
    return values


def _value(text: str, inputs: dict[str, str]) -> str:
    """A step's ``env:`` value: ``${{ inputs.NAME }}`` expressions filled in (no other kind)."""

    def fill(m: re.Match[str]) -> str:
        ref = re.fullmatch(r"inputs\.([\w-]+)", m.group(1))
        assert ref is not None, f"not an input: {m.group(0)}"
        return inputs[ref.group(1)]

    return EXPRESSION.sub(fill, str(text))


def _holds(condition: str | None, inputs: dict[str, str]) -> bool:
    """An ``if:`` of the one form the action uses, compared as GitHub compares strings
    (ignoring case)."""
    if condition is None:
        return True
    m = re.fullmatch(r"inputs\.([\w-]+) == '([^']*)'", condition.strip())
    assert m is not None, f"an if: this test cannot evaluate: {condition}"
    return inputs[m.group(1)].lower() == m.group(2).lower()


def _is_install(step: dict[str, Any]) -> bool:
    return "pip install" in step.get("run", "")


def _taken(inputs: dict[str, str]) -> list[dict[str, Any]]:
    return [step for step in STEPS if _holds(step.get("if"), inputs)]


@dataclass
class ActionRun:
    exit_code: int
    stdout: str
    stderr: str
    steps: list[str]
    """The names of the run: steps executed, the failing one last."""
    summary: str
    """The step summary the last step executed wrote."""

    def __str__(self) -> str:
        return f"exit {self.exit_code}, steps {self.steps}\n{self.stdout}\n{self.stderr}"


def run_action(workspace: Path, env: dict[str, str] | None = None, /, **given: str) -> ActionRun:
    """Run the action's steps for ``given`` inputs, in ``workspace`` (the job's working
    directory), the install step replaced by the mtpcheck installed next to this Python."""
    inputs = _inputs(**given)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "HF_"))}
    base.update(
        PATH=os.pathsep.join([str(BIN), base.get("PATH", "")]),
        GITHUB_ACTION_PATH=str(ROOT),
        GITHUB_WORKSPACE=str(workspace),
        **(env or {}),
    )
    scripts = workspace.parent / f"{workspace.name}-runner"
    scripts.mkdir(exist_ok=True)
    names: list[str] = []
    out = err = summary = ""
    for n, step in enumerate(_taken(inputs)):
        if "uses" in step or _is_install(step):
            continue
        assert step["shell"] == "bash", step
        script = scripts / f"step{n}.sh"
        script.write_text(step["run"])
        summary_file = scripts / f"summary{n}.md"
        summary_file.touch()  # the runner creates each step's file, empty
        step_env = {**base, "GITHUB_STEP_SUMMARY": str(summary_file)}
        step_env.update({k: _value(v, inputs) for k, v in step.get("env", {}).items()})
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workspace, env=step_env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        names.append(step["name"])
        out, err, summary = done.stdout, done.stderr, summary_file.read_text()
        if done.returncode != 0:
            return ActionRun(done.returncode, out, err, names, summary)
    return ActionRun(0, out, err, names, summary)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    assert shutil.which("mtpcheck", path=str(BIN)), f"mtpcheck is not installed in {BIN}"
    (tmp_path / "workspace").mkdir()
    return tmp_path / "workspace"


def _junit(path: Path) -> tuple[ET.Element, dict[str, ET.Element]]:
    suite = ET.parse(path).getroot()
    assert suite.tag == "testsuite"
    return suite, {case.get("name", ""): case for case in suite.iter("testcase")}


def _checks(run_cli: Any, path: Path) -> dict[str, str]:
    """Each check of ``mtpcheck inspect PATH`` run directly, with its status."""
    run = run_cli("inspect", path, "--format", "json")
    return {check["name"]: check["status"] for check in json.loads(run.stdout)["checks"]}


# --- what the file says --------------------------------------------------------------------


def test_inputs_reach_the_scripts_as_environment_variables_only() -> None:
    used = set()
    for step in STEPS:
        if "run" in step:  # an expression in a script's text would be pasted into the shell
            assert not EXPRESSION.search(step["run"]), step["name"]
        for value in [*step.get("env", {}).values(), *step.get("with", {}).values()]:
            m = re.fullmatch(r"\$\{\{ inputs\.([\w-]+) \}\}", str(value))
            assert m is not None and m.group(1) in INPUTS, value
            used.add(m.group(1))
    assert used == set(INPUTS)  # every input does something
    assert INPUTS["command"]["default"] == "roundtrip"  # what the action did before it had one


@pytest.mark.parametrize("command", ["inspect", "roundtrip"])
def test_each_command_installs_one_thing(command: str) -> None:
    (install,) = [step for step in _taken(_inputs(command=command, path="x")) if _is_install(step)]
    (line,) = install["run"].strip().splitlines()
    argv = line.split()
    assert argv[:4] == ["python", "-m", "pip", "install"]
    if command == "inspect":  # the core: no extra, so no torch and no index to fetch it from
        assert argv[4:] == ["--quiet", '"$GITHUB_ACTION_PATH"']
    else:
        assert argv[4:] == [
            "--quiet", "--extra-index-url", "https://download.pytorch.org/whl/cpu",
            '"$GITHUB_ACTION_PATH[convert]"',
        ]  # fmt: skip
    assert not [step for step in _taken(_inputs(command="inpsect", path="x")) if _is_install(step)]


def _requirements(extras: str) -> set[str]:
    """The distributions ``pip install .[EXTRAS]`` asks for, by pyproject.toml (an extra
    naming mtpcheck's own extras expanded; an extra pyproject lacks gives nothing, as pip
    gives)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted, seen = [*project["dependencies"]], set()
    for extra in filter(None, extras.split(",")):
        wanted += project.get("optional-dependencies", {}).get(extra, [])
    names = set()
    while wanted:
        m = re.match(r"([A-Za-z0-9._-]+)(?:\[([^\]]*)\])?", wanted.pop())
        assert m is not None
        name = m.group(1).lower().replace("_", "-")
        if name == "mtpcheck":
            for extra in set((m.group(2) or "").split(",")) - seen - {""}:
                seen.add(extra)
                wanted += project["optional-dependencies"].get(extra, [])
        else:
            names.add(name)
    return names


def test_the_roundtrip_install_brings_what_it_converts_with() -> None:
    (install,) = [s for s in _taken(_inputs(path="x")) if _is_install(s)]
    m = re.search(r'"\$GITHUB_ACTION_PATH\[([\w,-]+)\]"', install["run"])
    assert m is not None
    assert {"torch", "transformers", "megatron-core"} <= _requirements(m.group(1))
    assert not {"torch", "transformers", "megatron-core", "matplotlib"} & _requirements("")


# --- inspect, run as the runner runs it ------------------------------------------------------


def _drop_tensor(folder: Path, name: str) -> None:
    """Take one tensor out of the shard that holds it, and out of the index, so that the files
    still agree with each other and only the model is short of it."""
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = folder / index["weight_map"].pop(name)
    raw = shard.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    data = raw[8 + length :]
    tensors = {}
    for key, entry in header.items():
        start, end = entry["data_offsets"]
        if key != name:
            tensors[key] = (entry["dtype"], entry["shape"], data[start:end])
    assert len(tensors) == len(header) - 1
    write_safetensors(shard, tensors)
    index_path.write_text(json.dumps(index))


@pytest.fixture
def checkpoint(workspace: Path) -> Path:
    """fixtures/deepseek_v3, checked out in the workspace as a repository would hold it."""
    dst = workspace / "checkpoints" / "deepseek_v3"
    shutil.copytree(FIXTURES / "deepseek_v3", dst)
    return dst


def test_inspect_passes_an_intact_checkpoint(workspace: Path, checkpoint: Path, run_cli) -> None:
    run = run_action(workspace, command="inspect", path="checkpoints/deepseek_v3")
    assert run.exit_code == 0, run
    assert run.steps == ["Check inputs", "Run mtpcheck"]
    assert run.stdout.splitlines()[-1] == "verdict: PASS"
    checks = _checks(run_cli, checkpoint)
    assert "fail" not in checks.values()
    suite, cases = _junit(workspace / INPUTS["junit-xml"]["default"])  # relative to the workspace
    assert suite.get("name") == "mtpcheck.inspect"
    assert list(cases) == list(checks)  # one testcase per check
    assert suite.get("tests") == str(len(checks)) and suite.get("failures") == "0"
    assert not list(suite.iter("failure"))
    assert {case.get("file") for case in cases.values()} == {"checkpoints/deepseek_v3"}
    assert run.summary.startswith("## mtpcheck inspect:") and "PASS" in run.summary.splitlines()[0]
    assert "`checkpoints/deepseek_v3`" in run.summary
    for check in checks:
        assert f"| {check} |" in run.summary


def test_inspect_fails_a_checkpoint_short_of_an_mtp_tensor(
    workspace: Path, checkpoint: Path, run_cli
) -> None:
    layers = json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"]
    missing = f"model.layers.{layers}.eh_proj.weight"  # the MTP layer's projection
    _drop_tensor(checkpoint, missing)
    checks = _checks(run_cli, checkpoint)
    failed = [name for name, status in checks.items() if status == "fail"]
    assert CheckName.MTP_LAYERS in failed

    run = run_action(
        workspace, command="inspect", path="checkpoints/deepseek_v3", junit_xml="r.xml"
    )
    assert run.exit_code == 1, run
    assert run.steps == ["Check inputs", "Run mtpcheck"]
    assert run.stdout.splitlines()[-1].startswith("verdict: FAIL")
    suite, cases = _junit(workspace / "r.xml")
    assert list(cases) == list(checks)
    assert suite.get("failures") == str(len(failed))
    assert [name for name, case in cases.items() if case.find("failure") is not None] == failed
    failure = cases[CheckName.MTP_LAYERS].find("failure")
    assert failure is not None and missing in (failure.get("message", "") + (failure.text or ""))
    assert "FAIL" in run.summary.splitlines()[0] and missing in run.summary


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    fake = FakeHub()
    fake.add("org/deepseek_v3", FIXTURES / "deepseek_v3")
    fake.gated.add("org/deepseek_v3")
    with HubServer(fake) as url:
        fake.url = url  # type: ignore[attr-defined]
        yield fake


@pytest.fixture
def hub_env(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hub-cache")}  # type: ignore[attr-defined]


def test_inspect_reads_a_gated_hub_repository_with_the_token_given(
    hub: FakeHub, hub_env: dict[str, str], workspace: Path
) -> None:
    repo = "hf://org/deepseek_v3"
    refused = run_action(workspace, hub_env, command="inspect", path=repo)
    assert refused.exit_code == 2, refused
    assert refused.stderr.startswith(f"mtpcheck: error: {repo}: gated repository")
    assert not (workspace / "mtpcheck-junit.xml").exists()

    secret = "hf_not_a_real_token"
    run = run_action(workspace, hub_env, command="inspect", path=repo, hf_token=secret)
    assert run.exit_code == 0, run
    assert secret not in run.stdout + run.stderr + run.summary
    suite, cases = _junit(workspace / "mtpcheck-junit.xml")
    assert suite.get("failures") == "0" and CheckName.MTP_LAYERS in cases
    assert {case.get("file") for case in cases.values()} == {repo}
    assert f"`{repo}`" in run.summary

    # an HF_TOKEN the job already has is used when the input is empty
    env = {**hub_env, "HF_TOKEN": secret}
    assert run_action(workspace, env, command="inspect", path=repo).exit_code == 0


def test_inspect_reads_the_hub_revision_in_the_path(
    hub: FakeHub, hub_env: dict[str, str], workspace: Path
) -> None:
    env = {**hub_env, "HF_TOKEN": "hf_x"}
    pinned = f"hf://org/deepseek_v3@{hub.commit('org/deepseek_v3')}"
    assert run_action(workspace, env, command="inspect", path=pinned).exit_code == 0
    wrong = run_action(workspace, env, command="inspect", path="hf://org/deepseek_v3@no-such")
    assert wrong.exit_code == 2, wrong
    assert "no-such" in wrong.stderr


def test_fetch_reads_the_shared_copies_a_header_audit_skips(
    hub: FakeHub, hub_env: dict[str, str], workspace: Path
) -> None:
    env = {**hub_env, "HF_TOKEN": "hf_x"}
    results = {}
    for fetch in ("false", "true"):
        run = run_action(
            workspace, env, command="inspect", path="hf://org/deepseek_v3", fetch=fetch
        )
        assert run.exit_code == 0, run
        _, cases = _junit(workspace / "mtpcheck-junit.xml")
        results[fetch] = cases[CheckName.SHARED_COPIES]
    assert results["false"].find("skipped") is not None
    assert results["true"].find("skipped") is None and results["true"].find("failure") is None
    assert "bit-identical" in (results["true"].findtext("system-out") or "")


@pytest.mark.parametrize(
    ("command", "given", "said"),
    [
        ("inspect", {"to_megatron": "c {src} {dst}"}, "to-megatron is for command: roundtrip"),
        ("inspect", {"to_hf": "c {src} {dst}"}, "to-hf is for command: roundtrip"),
        ("inspect", {"synthetic": "true"}, "synthetic is for command: roundtrip"),
        ("inspect", {"timeout": "60"}, "timeout is for command: roundtrip"),
        ("roundtrip", {"fetch": "true"}, "fetch is for command: inspect"),
        ("roundtrip", {"hf_token": "hf_x"}, "hf-token is for command: inspect"),
        ("Inspect", {}, "command must be roundtrip or inspect"),
    ],
)  # fmt: skip
def test_an_input_of_the_other_command_is_refused_before_any_install(
    workspace: Path, checkpoint: Path, command: str, given: dict[str, str], said: str
) -> None:
    run = run_action(workspace, command=command, path="checkpoints/deepseek_v3", **given)
    assert run.exit_code == 2, run
    assert run.steps == ["Check inputs"]  # the first step: nothing installed, nothing run
    assert STEPS[0]["name"] == "Check inputs"
    assert run.stdout == f"::error title=mtpcheck action::{said}\n"
    assert not (workspace / "mtpcheck-junit.xml").exists()


def test_a_path_is_an_argument_not_shell_text(workspace: Path) -> None:
    path = 'x"; touch injected; echo "$(touch injected2)'
    run = run_action(workspace, command="inspect", path=path)
    assert run.exit_code == 2, run
    assert path in run.stderr  # mtpcheck was given the text as it is
    assert not list(workspace.iterdir())  # no file made by the text


# --- roundtrip, still the default ----------------------------------------------------------


def test_roundtrip_is_what_the_action_runs_without_a_command(workspace: Path) -> None:
    shutil.copytree(FIXTURES / "mimo", workspace / "mimo")
    run = run_action(workspace, path="mimo", junit_xml="roundtrip.xml")
    assert run.exit_code == 0, run
    assert run.steps == ["Check inputs", "Run mtpcheck"]
    suite, cases = _junit(workspace / "roundtrip.xml")
    assert suite.get("name") == "mtpcheck.roundtrip" and suite.get("failures") == "0"
    assert any(name.startswith("stage1-") for name in cases)
    assert run.summary.startswith("## mtpcheck roundtrip:")
