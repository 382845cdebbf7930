"""``roundtrip TARGET --to-drafter CMD --from-drafter CMD`` with speculators 0.9.0's own
``convert --algorithm mtp`` and ``stitch-mtp`` as the converters, on the Qwen3-Next fixture:
the drafter is the target's MTP layer bit for bit, and so is the stitched target's."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES
from tests.thirdparty.tools import REQUIRE, SPECULATORS_VENV

TARGET = FIXTURES / "qwen3_next"
CONVERT = (
    "{venv}/bin/speculators convert {{src}} --algorithm mtp --verifier {{src}} "
    "--output-path {{dst}} --validate-device cpu"
)
STITCH = "{venv}/bin/speculators stitch-mtp {{drafter}} {{src}} --output-path {{dst}}"


def _speculators() -> Path:
    if not (SPECULATORS_VENV / "bin" / "speculators").exists():
        reason = (
            f"no speculators venv at {SPECULATORS_VENV}: "
            "bash tests/thirdparty/speculators/install_venv.sh .venv-speculators"
        )
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)
    return SPECULATORS_VENV


def _findings(stdout: str) -> dict[str, list[tuple[str, str, str]]]:
    report: dict[str, Any] = json.loads(stdout)
    return {
        c["name"]: [(f["status"], f["subject"], f["message"]) for f in c["findings"]]
        for c in report["checks"]
    }


@pytest.mark.slow
def test_speculators_out_and_back_keeps_the_mtp_layer(run_cli) -> None:
    venv = _speculators()
    run = run_cli(
        "roundtrip",
        TARGET,
        "--to-drafter",
        CONVERT.format(venv=venv),
        "--from-drafter",
        STITCH.format(venv=venv),
        "--format",
        "json",
    )
    assert run.exit_code == 0, run.stdout + run.stderr
    found = _findings(run.stdout)
    assert found[CheckName.DRAFTER_MTP] == [
        (
            "pass",
            "mtp layer",
            "29 tensors bit-identical to the target's mtp.layers.0.* (7264 bytes); stored and "
            "never read: verifier_lm_head.weight",
        )
    ]
    assert found[CheckName.TENSORS] == [
        ("pass", "MTP scope", "31 of 31 tensors bit-identical (11360 bytes compared equal)")
    ]
    assert [s for s, *_ in found[CheckName.STAGE1] + found[CheckName.STAGE2]] == ["pass", "pass"]


@pytest.mark.slow
def test_a_bit_the_drafter_format_lost_fails_by_name(run_cli, tmp_path: Path) -> None:
    """Stage 1 is speculators' converter followed by one flipped bit in what it wrote."""
    venv = _speculators()
    flip = tmp_path / "flip.py"
    flip.write_text(
        "import json, struct, sys\n"
        "path = sys.argv[1] + '/model.safetensors'\n"
        "data = bytearray(open(path, 'rb').read())\n"
        "size = struct.unpack('<Q', data[:8])[0]\n"
        "header = json.loads(data[8:8 + size])\n"
        "start = header['mtp_layers.0.input_proj.weight']['data_offsets'][0]\n"
        "data[8 + size + start] ^= 1\n"
        "open(path, 'wb').write(data)\n"
    )
    convert = CONVERT.format(venv=venv) + f" && {sys.executable} {flip} {{dst}}"
    run = run_cli(
        "roundtrip",
        TARGET,
        "--to-drafter",
        convert,
        "--from-drafter",
        STITCH.format(venv=venv),
        "--format",
        "json",
    )
    assert run.exit_code == 1
    found = _findings(run.stdout)
    [(status, subject, message)] = found[CheckName.DRAFTER_MTP]
    assert (status, subject) == ("fail", "mtp_layers.0.input_proj.weight")
    assert message.startswith("bits differ in 1 of 512 elements, first at index [0, 0]")
    # stitched back, the flipped bit is in the target's mtp.fc.weight
    assert ("fail", "mtp.fc.weight") in [(s, n) for s, n, _ in found[CheckName.TENSORS]]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--to-drafter", "c {src} {dst}"], "--to-drafter and --from-drafter go together"),
        (
            [
                "--to-drafter",
                "c {src} {dst}",
                "--from-drafter",
                "s {src} {drafter} {dst}",
                "--synthetic",
            ],
            "--to-drafter / --from-drafter do not go with --synthetic",
        ),
        (
            ["--to-drafter", "c {src} {dst}", "--from-drafter", "s {src} {dst}"],
            "converter command 's {src} {dst}' lacks {drafter}",
        ),
    ],
)
def test_the_drafter_trip_refuses_options_that_do_not_go_together(
    run_cli, args: list[str], said: str
) -> None:
    run = run_cli("roundtrip", TARGET, *args)
    assert run.exit_code == 2
    assert said in run.stderr
