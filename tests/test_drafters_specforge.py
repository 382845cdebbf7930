"""Native EAGLE-3 drafters exported by SpecForge 0.2.0 itself (``specforge export --to sglang``,
``tests/thirdparty/specforge``, NOTES.md there; shipped, not rebuilt in CI: SpecForge installs
only with its CUDA torch), against the tiny Llama target of the speculators corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtpcheck import CheckName
from tests.report_views import findings_of, report_of

DATA = Path(__file__).resolve().parent / "data"
TARGET = DATA / "speculators" / "llama-target"


def _inspect(run_cli: Any, case: str) -> tuple[int, dict[str, Any]]:
    return report_of(run_cli, "inspect", DATA / "specforge" / case, "--target", TARGET)


def test_the_export_with_its_taps_recorded_passes_and_names_both_numberings(run_cli) -> None:
    code, report = _inspect(run_cli, "eagle3-native-aux")
    assert code == 0
    assert findings_of(report, CheckName.DRAFTER_KIND)[0][:2] == ("pass", "eagle3")
    taps = findings_of(report, CheckName.DRAFTER_TAPS)
    assert taps[0] == (
        "pass",
        "eagle_config.eagle_aux_hidden_state_layer_ids",
        "[1, 2, 3], increasing inside the target's 4 layers, in the hidden-state index numbering",
    )
    said = {subject: message for _, subject, message in taps[1:]}
    assert said["SpecForge 0.2.0"].startswith("trains on them as 0-based layer indices")
    assert said["vLLM 0.32"].endswith("(one layer earlier than SpecForge trained on)")
    assert findings_of(report, CheckName.DRAFTER_VOCAB)[0][0] == "pass"
    assert findings_of(report, CheckName.PAIRING_EMBEDDING)[0] == (
        "pass",
        "embed_tokens.weight",
        "absent: the engines use the target's",
    )


def test_the_export_without_taps_fails_naming_the_engines_guess(run_cli) -> None:
    """SpecForge records the taps only where its draft config has them (NOTES.md)."""
    code, report = _inspect(run_cli, "eagle3-native")
    assert code == 1
    failing = [
        (c["name"], f["subject"])
        for c in report["checks"]
        for f in c["findings"]
        if f["status"] == "fail"
    ]
    assert failing == [("drafter-taps", "eagle_config.eagle_aux_hidden_state_layer_ids")]
