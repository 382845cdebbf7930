"""Each option is declared once, on its command's dataclass; the API refuses exactly what the
CLI refuses, with the same message.

Every rule between options, every range and every choice is exercised both ways: the command
line (exit 2, one line) and :mod:`mtpcheck.api` called with the parameters click parsed from
that same command line (a :class:`~mtpcheck.declared.UsageError` with the same words).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from mtpcheck import api
from mtpcheck.accept.options import AcceptOptions
from mtpcheck.checks.options import DiffOptions, InspectOptions
from mtpcheck.cli import cli, main
from mtpcheck.declared import UsageError, declared_fields, flag_of
from mtpcheck.pipeline.options import HfToMegatronOptions, MegatronToHfOptions, RoundtripOptions

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CKPT = FIXTURES / "accept_deepseek_v3"
WORKLOAD = CKPT / "workloads" / "in_domain.jsonl"
DRAFTER = FIXTURES / "deepseek_v3"  # any folder: the rules are checked before it is read
W = ("--workload", f"w={WORKLOAD}")
SERVER = ("--server", "http://127.0.0.1:9")
ENGINE = ("--engine", "vllm")
DRAFTER_MSG = (
    "{} does not apply to --drafter: mtpcheck scores and compares a checkpoint's own MTP "
    "layers only"
)

ACCEPT_RULES: list[tuple[tuple[str, ...], str]] = [
    *(
        ((str(CKPT), *W, flag, value), f"{flag} needs --server")
        for flag, value in (
            ("--server-engine", "vllm"),
            ("--server-model", "m"),
            ("--concurrency", "2"),
            ("--request-timeout", "5"),
            ("--save-profile", "p.json"),
            ("--profile", "p.json"),
        )
    ),
    ((str(CKPT), *W, "--drafter", str(DRAFTER)), "--drafter needs --server or --engine vllm"),
    (W, "Missing argument 'CKPT' (only --server runs without one)."),
    ((str(CKPT), *W, "--seed", "1"), "--seed needs --online"),
    *(
        ((str(CKPT), *W, *given), f"{given[0]} needs --engine vllm")
        for given in (
            ("--vllm-python", "python3"),
            ("--tensor-parallel-size", "2"),
            ("--pipeline-parallel-size", "2"),
            ("--distributed-executor-backend", "mp"),
            ("--vllm-arg", "a=1"),
            ("--engine-log", "vllm.log"),
            ("--teacher-forced",),
        )
    ),
    *(
        ((str(CKPT), *W, *ENGINE, *given), f"{given[0]} does not apply to --engine vllm")
        for given in (
            ("--online",),
            ("--device-map", "auto"),
            ("--chain", "pre-norm"),
            ("--online-engine", "transformers"),
            ("--draft-rule", "training"),
            ("--seed", "1"),
        )
    ),
    *(
        ((str(CKPT), *W, *ENGINE, "--drafter", str(DRAFTER), *given), DRAFTER_MSG.format(given[0]))
        for given in (("--teacher-forced",), ("--compare", str(CKPT)))
    ),
    *(
        ((*W, *SERVER, *given), f"{given[0]} does not apply to --server")
        for given in (
            ("--compare", str(CKPT)),
            ("--device-map", "auto"),
            ("--plot", "a.png"),
            ("--online",),
            ("--online-engine", "transformers"),
            ("--depths", "2"),
            ("--draft-rule", "training"),
            ("--chain", "pre-norm"),
            ("--seed", "1"),
            ("--engine", "vllm"),
            ("--vllm-python", "python3"),
            ("--tensor-parallel-size", "2"),
            ("--pipeline-parallel-size", "2"),
            ("--distributed-executor-backend", "ray"),
            ("--vllm-arg", "a=1"),
            ("--engine-log", "vllm.log"),
            ("--teacher-forced",),
        )
    ),
    (
        (str(CKPT), *W, *SERVER, "--drafter", str(DRAFTER)),
        "--drafter with CKPT: the offline expectation is computed for a checkpoint's own MTP "
        "layers only; give the target as --tokenizer instead",
    ),
    (
        (str(CKPT), *W, *ENGINE, "--vllm-arg", "no-equals"),
        "Invalid value for --vllm-arg: 'no-equals': expected KEY=VALUE with KEY a vllm.LLM "
        "argument name",
    ),
    ((str(CKPT), *W, *W), "Invalid value for --workload: workload names must be unique"),
    (
        (str(CKPT), *W, "--plot", "/no/such/dir/x.png"),
        "Invalid value for --plot: /no/such/dir does not exist",
    ),
]
"""(command line after ``accept``, the one line said) for every rule between options."""

ROUNDTRIP_RULES: list[tuple[tuple[str, ...], str]] = [
    (("--to-drafter", "c {src} {dst}"), "--to-drafter and --from-drafter go together"),
    (("--from-drafter", "s {src} {drafter} {dst}"), "--to-drafter and --from-drafter go together"),
    *(
        (
            ("--to-drafter", "c {src} {dst}", "--from-drafter", "s {src} {drafter} {dst}", *given),
            f"--to-drafter / --from-drafter do not go with {given[0]}",
        )
        for given in (
            ("--to-megatron", "m {src} {dst}"),
            ("--to-hf", "h {src} {dst}"),
            ("--synthetic",),
        )
    ),  # fmt: skip
    (
        ("--to-drafter", "c {src} {dst}", "--from-drafter", "s {src} {dst}"),
        "Invalid value for --from-drafter: converter command 's {src} {dst}' lacks {drafter}",
    ),
    *(
        (
            (flag, "c {src}"),
            f"Invalid value for {flag}: converter command 'c {{src}}' lacks {{dst}}",
        )
        for flag in ("--to-megatron", "--to-hf")
    ),
]
"""(command line after ``roundtrip PATH``, the one line said)."""

CASES = [
    *(("accept", args, said) for args, said in ACCEPT_RULES),
    *(("roundtrip", (str(FIXTURES / "mimo"), *args), said) for args, said in ROUNDTRIP_RULES),
]

API: dict[str, Callable[..., Any]] = {
    "accept": api.accept,
    "roundtrip": api.roundtrip,
    "diff": api.diff,
    "inspect": api.inspect,
}
OUTPUT_ONLY = {"fmt", "junit_xml", "markdown", "debug", "quiet", "strict"}
"""The shared options of a report's output, which the API does not take."""


def _said(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    """The exit code and stderr of ``mtpcheck ARGS`` (the console script's own entry point,
    in this process)."""
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def _parsed(command: str, args: tuple[str, ...]) -> dict[str, Any]:
    """The parameters click makes of ``args``, as the command function receives them."""
    found = cli.get_command(click.Context(cli), command)
    assert found is not None
    with found.make_context(command, list(args)) as ctx:
        return {k: v for k, v in ctx.params.items() if k not in OUTPUT_ONLY}


@pytest.mark.parametrize(("command", "args", "said"), CASES, ids=lambda v: str(v)[:60])
def test_the_cli_and_the_api_refuse_alike(
    capsys: pytest.CaptureFixture[str],
    command: str,
    args: tuple[str, ...],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # relative output files land here, if any were written
    assert _said(capsys, command, *args) == (2, f"mtpcheck: error: {said}\n")
    with pytest.raises(UsageError) as raised:
        API[command](**_parsed(command, args))
    assert str(raised.value) == said
    assert list(tmp_path.iterdir()) == []


RANGES: list[tuple[str, dict[str, Any], tuple[str, ...], str]] = [
    ("max_tokens", {"max_tokens": 1}, ("--max-tokens", "1"), "1 is not in the range x>=2."),
    ("temperature", {"temperature": -1.0}, ("--temperature", "-1"),
     "-1.0 is not in the range x>=0."),
    ("min_acceptance", {"min_acceptance": 2.0}, ("--min-acceptance", "2"),
     "2.0 is not in the range 0<=x<=1."),
    ("depths", {"depths": 0}, ("--depths", "0"), "0 is not in the range x>=1."),
    ("seed", {"seed": -1}, ("--seed", "-1"), "-1 is not in the range x>=0."),
    ("device", {"device": "tpu"}, ("--device", "tpu"), "'tpu' is not one of 'cpu', 'cuda'."),
]  # fmt: skip
"""A value outside its declared range or choices: click refuses it on the command line, the
dataclass in the API, in the same words."""


@pytest.mark.parametrize(("name", "keywords", "args", "reason"), RANGES, ids=lambda v: str(v))
def test_a_value_out_of_range_is_refused_alike(
    capsys: pytest.CaptureFixture[str], name: str, keywords: dict[str, Any], args: tuple[str, ...],
    reason: str,
) -> None:  # fmt: skip
    flag = "--" + name.replace("_", "-")
    said = f"Invalid value for '{flag}': {reason}"
    assert _said(capsys, "accept", CKPT, *W, *args) == (2, f"mtpcheck: error: {said}\n")
    with pytest.raises(UsageError) as raised:
        api.accept(CKPT, (("w", WORKLOAD),), **keywords)
    assert str(raised.value) == said


def test_a_request_timeout_of_zero_is_refused_alike(capsys: pytest.CaptureFixture[str]) -> None:
    said = "Invalid value for '--request-timeout': 0.0 is not in the range x>0."
    run = _said(capsys, "accept", *W, *SERVER, "--request-timeout", "0")
    assert run == (2, f"mtpcheck: error: {said}\n")
    with pytest.raises(UsageError, match="x>0"):
        api.accept(None, (("w", WORKLOAD),), server_url="http://127.0.0.1:9", request_timeout=0.0)


@pytest.mark.parametrize(
    "cls",
    [AcceptOptions, InspectOptions, DiffOptions, RoundtripOptions, HfToMegatronOptions,
     MegatronToHfOptions],
)  # fmt: skip
def test_every_option_of_the_command_line_is_a_declared_field(cls: type) -> None:
    """The click parameters are the dataclass's declared fields, in order, and nothing else
    but the shared output options: an option added to the dataclass is an option of the CLI."""
    command = {
        AcceptOptions: ("accept",),
        InspectOptions: ("inspect",),
        DiffOptions: ("diff",),
        RoundtripOptions: ("roundtrip",),
        HfToMegatronOptions: ("convert", "hf-to-megatron"),
        MegatronToHfOptions: ("convert", "megatron-to-hf"),
    }[cls]
    group: Any = cli
    for name in command:
        group = group.get_command(click.Context(group), name)
    names = [p.name for p in group.params if p.name not in OUTPUT_ONLY | {"trust_pickle"}]
    declared = [f.name for f, _ in declared_fields(cls)]
    assert names == declared
    for param, (f, d) in zip(
        (p for p in group.params if p.name in declared), declared_fields(cls), strict=True
    ):
        if isinstance(param, click.Option):
            assert param.opts[0] == flag_of(f, d).split("/")[0]
            assert param.help == d.help


def test_the_api_signature_is_the_dataclass() -> None:
    """A keyword of the API is a field of its options, with the field's default."""
    import inspect

    for function, cls in ((api.accept, AcceptOptions), (api.diff, DiffOptions)):
        parameters = inspect.signature(function).parameters
        assert list(parameters) == [f.name for f in dataclasses.fields(cls)]


def test_the_api_page_example_is_refused_as_it_says() -> None:
    page = (FIXTURES.parent / "docs" / "api.md").read_text()
    assert "print(e)  # --online does not apply to --engine vllm" in page
    with pytest.raises(UsageError, match="^--online does not apply to --engine vllm$"):
        api.accept(Path("ckpt"), (("chat", Path("chat.jsonl")),), engine="vllm", online=True)


def test_each_command_page_gets_its_generated_options_table() -> None:
    import importlib.util

    hook_path = FIXTURES.parent / "docs" / "hooks" / "options.py"
    spec = importlib.util.spec_from_file_location("options_hook", hook_path)
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    for command, (page, cls) in hook.COMMANDS.items():
        text = (FIXTURES.parent / "docs" / page).read_text()
        rendered = hook.render(text, page)
        assert hook.marker(command) not in rendered
        for f, _ in declared_fields(cls):
            assert f"| `{f.name}` |" in rendered, (command, f.name)
    with pytest.raises(ValueError, match="marker"):
        hook.render("no marker here", "commands/accept.md")
