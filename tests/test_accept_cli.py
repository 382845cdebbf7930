"""``mtpcheck accept`` on the command line: outputs, CI gate, plot, workloads, refusals."""

from __future__ import annotations

import json
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mtpcheck.accept.options import parse_spec
from mtpcheck.accept.workloads import load_tokenizer, read_records, tokenise
from mtpcheck.errors import InputError
from mtpcheck.report.json_ import SCHEMA_VERSION
from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "accept_deepseek_v3"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def workloads(tmp_path: Path) -> list[str]:
    """``--workload`` arguments: the first 4 sequences of each shipped workload."""
    args = []
    for name in ("in_domain", "shuffled"):
        lines = (FIXTURE / "workloads" / f"{name}.jsonl").read_text().splitlines(keepends=True)
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(lines[:4]))
        args += ["--workload", f"{name}={path}"]
    return args


def test_every_output_format(run_cli, workloads, tmp_path: Path) -> None:
    junit, md, png = tmp_path / "r.xml", tmp_path / "r.md", tmp_path / "accept.png"
    run = run_cli(
        "accept", FIXTURE, *workloads, "--format", "json", "--junit-xml", junit,
        "--markdown", md, "--plot", png,
    )  # fmt: skip
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    assert report["schema_version"] == SCHEMA_VERSION
    assert (report["command"], report["ok"]) == ("accept", True)
    rows = {r["workload"]: r for r in report["acceptance"]}
    assert list(rows) == ["in_domain", "shuffled"]
    for r in rows.values():
        assert r["drafter"] and r["positions"] == 4 * 63 and r["sequences"] == 4
        assert 0 <= r["greedy"] <= 1 and 0 <= r["alpha"] <= 1
        assert r["tokens_per_pass"] == pytest.approx(1 + r["alpha"])
        low, high = r["alpha_ci"]
        assert low <= r["alpha"] <= high and r["temperature"] == 1.0
        assert r["greedy_hits"] == round(r["greedy"] * r["positions"])
    assert rows["in_domain"]["alpha"] > rows["shuffled"]["alpha"]
    assert report["acceptance_deltas"] == []
    assert [c["name"] for c in report["checks"]] == ["acceptance/in_domain", "acceptance/shuffled"]
    assert report["inputs"][0]["family"] == "deepseek_v3"

    suite = ET.parse(junit).getroot()
    cases = [c.get("name") for c in suite.iter("testcase")]
    assert cases == ["acceptance/in_domain", "acceptance/shuffled"]
    assert suite.get("failures") == "0"
    text = md.read_text()
    assert "**MTP acceptance**" in text and "| in_domain |" in text

    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert width >= 400 and height == 320
    assert 5_000 < len(data) < 200_000


def test_scoring_progress_counts_tokens_on_stderr(run_cli, workloads, monkeypatch) -> None:

    monkeypatch.setenv("MTPCHECK_PROGRESS_INTERVAL", "0")
    run = run_cli("accept", FIXTURE, *workloads, "--format", "json")
    assert run.exit_code == 0, run
    assert json.loads(run.stdout)["ok"] is True  # stdout is the report alone
    lines = run.stderr.splitlines()
    assert lines[0].startswith(f"mtpcheck: {FIXTURE}: model and MTP head loaded in ")
    for name in ("in_domain", "shuffled"):  # 4 sequences of 64 tokens: 63 positions each
        closing = [line for line in lines if line.startswith(f"mtpcheck: scoring {name}: ")]
        assert len(closing) == 1 and closing[0].startswith(
            f"mtpcheck: scoring {name}: 4 sequences, 252 tokens in "
        )
        assert closing[0].endswith(" tokens/s)")
    quiet = run_cli("accept", FIXTURE, *workloads, "--format", "json", "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_table_and_compare(run_cli, workloads) -> None:
    run = run_cli("accept", FIXTURE, *workloads[:2], "--compare", FIXTURE, "--temperature", "0")
    assert run.exit_code == 0, run
    assert "MTP acceptance (k=1, teacher-forced, T=0, 95% CI)" in run.stdout
    assert "B-A" in run.stdout and "+0.000 [+0.000, +0.000]" in run.stdout
    assert "verdict: PASS" in run.stdout


def test_min_acceptance_is_a_ci_gate(run_cli, workloads, tmp_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    run = run_cli("accept", FIXTURE, *workloads, "--min-acceptance", "0.6", "--junit-xml", junit)
    assert run.exit_code == 1, run
    assert "FAIL (acceptance/shuffled)" in run.stdout
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["acceptance/in_domain"].find("failure") is None
    failure = cases["acceptance/shuffled"].find("failure")
    assert failure is not None and "below --min-acceptance 0.6" in failure.get("message", "")
    passing = run_cli("accept", FIXTURE, *workloads, "--min-acceptance", "0.1")
    assert passing.exit_code == 0, passing


def test_unsupported_family_says_so(run_cli, tmp_path: Path) -> None:
    workload = tmp_path / "w.txt"
    workload.write_text("w01 w02 w03 w04\n")
    run = run_cli(
        "accept", FIXTURES / "mimo", "--workload", f"w={workload}", "--tokenizer", FIXTURE
    )
    assert run.exit_code == 2, run
    assert "accept does not support MiMo-7B yet" in run.stderr
    assert "DeepSeek-V3" in run.stderr and "GLM-4.5" in run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


@pytest.mark.parametrize("family", ["glm4_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe"])
def test_other_families_run(run_cli, tmp_path: Path, family: str) -> None:
    workload = tmp_path / "w.jsonl"  # words w00..w59 are ids 4..63, inside their 64-id vocab
    workload.write_text('{"text": "w01 w02 w03 w04 w05 w06 w07 w08"}\n{"text": "w10 w11 w12"}\n')
    run = run_cli(
        "accept", FIXTURES / family, "--workload", f"w={workload}", "--tokenizer", FIXTURE,
        "--format", "json",
    )  # fmt: skip
    assert run.exit_code == 0, run
    (row,) = json.loads(run.stdout)["acceptance"]
    assert row["drafter"] and row["positions"] == 8 + 3 and 0 <= row["alpha"] <= 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "nameonly"], "is not NAME=PATH"),
        (["--workload", "a b=x.jsonl"], "may use only letters"),
        (["--workload", "a=x.jsonl", "--workload", "a=y.jsonl"], "must be unique"),
        (["--workload", "a=x.jsonl", "--temperature", "-1"], "--temperature"),
    ],
)
def test_bad_options(run_cli, args: list[str], message: str) -> None:
    run = run_cli("accept", FIXTURE, *args)
    assert run.exit_code == 2, run
    assert message in run.stderr


def test_unreadable_workload_is_one_line(run_cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "w01"}\n{"prompt": "w02"}\n')
    run = run_cli("accept", FIXTURE, "--workload", f"bad={bad}")
    assert run.exit_code == 2, run
    assert f"{bad}: line 2: no 'text' string and no 'messages' list" in run.stderr


def test_workload_formats(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(FIXTURE)
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        json.dumps({"messages": [{"role": "user", "content": "w01 w02"}, {"content": "w03"}]})
        + "\n\n"
        + json.dumps({"text": "w04 w05"})
        + "\n"
    )
    (rendered, text) = tokenise("chat", chat, tokenizer, 512).sequences
    # the fixture's chat template joins contents with spaces and adds no BOS
    assert list(rendered) == tokenizer("w01 w02 w03", add_special_tokens=False)["input_ids"]
    assert list(text) == [1, *tokenizer("w04 w05", add_special_tokens=False)["input_ids"]]

    plain = tmp_path / "plain.txt"
    plain.write_text("w01 w02\nw03\n\n\nw04 w05 w06\n")
    assert read_records(plain) == ["w01 w02\nw03", "w04 w05 w06"]
    assert [len(s) for s in tokenise("p", plain, tokenizer, 3).sequences] == [3, 3]

    for content, reason in (
        ("not json\n", "line 1: not JSON"),
        ("[1, 2]\n", "line 1: expected a JSON object"),
        ('{"messages": []}\n', "line 1: 'messages' must be a non-empty list"),
        ("", "workload holds no text"),
    ):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(content)
        with pytest.raises(InputError, match=reason):
            tokenise("bad", bad, tokenizer, 512)
    with pytest.raises(InputError, match="no such file"):
        read_records(tmp_path / "absent.jsonl")
    assert parse_spec("code=data/code.jsonl") == ("code", Path("data/code.jsonl"))


def test_tokens_outside_the_vocabulary_are_refused(run_cli, tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"  # w90 is id 94, outside GLM fixture's 64 ids
    workload.write_text('{"text": "w01 w90"}\n')
    args = ("accept", FIXTURES / "glm4_moe", "--workload", f"w={workload}", "--tokenizer", FIXTURE)
    run = run_cli(*args)
    assert run.exit_code == 2, run
    assert "token id 94 is outside" in run.stderr
    # the engine path too, before any engine starts (this --vllm-python cannot run)
    engine = run_cli(*args, "--engine", "vllm", "--vllm-python", tmp_path / "no-python")
    assert engine.exit_code == 2, engine
    assert "token id 94 is outside" in engine.stderr


def test_checkpoint_without_tokenizer_needs_one(run_cli, tmp_path: Path) -> None:
    workload = tmp_path / "w.txt"
    workload.write_text("w01 w02\n")
    run = run_cli("accept", FIXTURES / "deepseek_v3", "--workload", f"w={workload}")
    assert run.exit_code == 2, run
    assert run.stderr.startswith(
        f"mtpcheck: error: {FIXTURES / 'deepseek_v3'}: no tokenizer that AutoTokenizer can "
        "load offline ("
    )
    # one line, whole, and it says what to do
    assert run.stderr.endswith(
        "); point --tokenizer DIR at the folder that holds the model's tokenizer files\n"
    )
    assert run.stderr.count("\n") == 1


def test_cuda_without_a_device_is_refused(run_cli, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    workload = tmp_path / "w.txt"
    workload.write_text("w01 w02\n")
    run = run_cli("accept", FIXTURE, "--workload", f"w={workload}", "--device", "cuda")
    assert run.exit_code == 2, run
    assert "--device cuda: no CUDA device is available" in run.stderr


def test_online_draft_then_verify_beside_teacher_forcing(run_cli, workloads, tmp_path) -> None:
    md = tmp_path / "r.md"
    run = run_cli(
        "accept", FIXTURE, *workloads, "--online", "--temperature", "0", "--new-tokens", "20",
        "--format", "json", "--markdown", md,
    )  # fmt: skip
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    rows = {o["workload"]: o for o in report["online_acceptance"]}
    assert list(rows) == ["in_domain", "shuffled"]
    for o in rows.values():
        assert (o["sequences"], o["prompt_tokens"], o["new_tokens"]) == (4, 9, 20)
        assert o["drafts"] >= 4 * 20 // 2  # at most two tokens per verify pass
        assert o["agreeing"] == o["drafts"]  # greedy: the same verdict at every drafted position
        first = o["accepted_per_position"][0]
        assert o["online"] == o["teacher_forced"] == first / o["drafts"]
        assert o["accepted_tokens"] == first  # k = 1: the one depth's
        assert o["tokens_per_pass"] == pytest.approx(1 + o["online"])
    assert rows["in_domain"]["online"] > rows["shuffled"]["online"]
    assert "**MTP acceptance online**" in md.read_text()
    assert "online draft-then-verify" in run.stderr
    sampled = run_cli(
        "accept", FIXTURE, *workloads[:2], "--online", "--temperature", "0.6",
        "--new-tokens", "8", "--format", "json",
    )  # fmt: skip
    [o] = json.loads(sampled.stdout)["online_acceptance"]
    assert o["agreeing"] is None and 0 < o["teacher_forced"] < 1
    plain = run_cli("accept", FIXTURE, *workloads[:2], "--format", "json")
    assert json.loads(plain.stdout)["online_acceptance"] == []


@pytest.mark.parametrize(
    ("family", "code", "said"),
    [
        ("mimo_v2_flash", 2, "accept does not support MiMo-V2-Flash yet: its MTP block"),
        ("bailing_hybrid", 2, "accept does not support Ling / Ring 2.x (Bailing) yet: its MTP"),
        ("deepseek_v4", 2, "accept does not support DeepSeek-V4 yet: split e_proj/h_proj"),
        ("gemma4_assistant", 0, "no drafter (this checkpoint is a drafter for a Gemma 4 model"),
    ],
)
def test_families_accept_cannot_measure_say_why(
    run_cli, tmp_path: Path, family: str, code: int, said: str
) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"text": "w01 w02 w03 w04 w05"}\n')
    run = run_cli(
        "accept", FIXTURES / family, "--workload", f"w={workload}", "--tokenizer", FIXTURE
    )
    assert run.exit_code == code, run
    assert said in run.stderr


def test_online_sampling_follows_its_seed(run_cli, workloads) -> None:
    """``--seed``: the same seed draws the same tokens, another seed others (T > 0)."""

    def online(seed: str) -> dict:
        run = run_cli(
            "accept", FIXTURE, *workloads[:2], "--online", "--temperature", "1",
            "--new-tokens", "8", "--seed", seed, "--format", "json",
        )  # fmt: skip
        assert run.exit_code == 0, run
        [o] = json.loads(run.stdout)["online_acceptance"]
        return o

    first, again, other = online("0"), online("0"), online("7")
    assert first == again
    assert (other["accepted_per_position"], other["drafts"]) != (
        first["accepted_per_position"], first["drafts"],
    )  # fmt: skip
