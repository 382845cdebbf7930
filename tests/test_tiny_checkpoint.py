"""``mtpcheck.testing.tiny_checkpoint``: something for a converter's own tests to convert,
built from the published configs the package ships (no file of this repository's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpcheck import CheckName
from mtpcheck.families.published import PUBLISHED_DIR, published_config, published_configs
from mtpcheck.testing import assert_mtp_intact, assert_mtp_preserved, tiny_checkpoint

NOT_BUILT = {
    "deepseek_v4__DeepSeek-V4-Flash": "fails main-model, mtp-layers, mtp-shapes",
    "deepseek_v4__DeepSeek-V4-Pro": "fails main-model, mtp-layers, mtp-shapes",
    "kimi_k25__Kimi-K2.5-NVFP4": "does not know model_type 'kimi_k25' as an MTP family",
    "step3p5__Step-3.5-Flash": "Unrecognized configuration class",
}
"""The published configs whose tiny build is refused, and why: DeepSeek-V4's build does not
pass its own audit, Kimi-K2.5 is no family mtpcheck knows, transformers cannot build
Step-3.5-Flash."""


def test_the_configs_are_package_data() -> None:
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"published/*.json"' in pyproject
    assert PUBLISHED_DIR.parent.name == "families" and len(published_configs()) == 24


def test_a_name_is_a_release_or_a_model_type() -> None:
    assert published_config("DeepSeek-V3").name == "deepseek_v3__DeepSeek-V3.json"
    assert published_config("GLM-5").name == "glm_moe_dsa__GLM-5.json"
    assert published_config("glm_moe_dsa").name == "glm_moe_dsa__GLM-5.2.json"
    with pytest.raises(KeyError, match="no published config for 'llama'; model types: "):
        published_config("llama")


@pytest.mark.parametrize("family", ["glm4_moe", "qwen3_next"])
def test_the_tiny_checkpoint_holds_its_mtp_layers(tmp_path: Path, family: str) -> None:
    built = tiny_checkpoint(family, tmp_path / "tiny")
    assert built == tmp_path / "tiny"
    report = assert_mtp_intact(built)
    assert report.check(CheckName.MTP_COUNT).findings[0].details["present"] == 1
    assert report.check(CheckName.FAMILY).findings[0].subject == family
    assert_mtp_preserved(built, built)


def test_it_writes_only_into_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="absent or empty folder"):
        tiny_checkpoint("glm4_moe", tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("release", ["DeepSeek-V4-Flash", "Step-3.5-Flash"])
def test_a_build_it_cannot_vouch_for_is_refused_and_removed(tmp_path: Path, release: str) -> None:
    stem = published_config(release).stem
    with pytest.raises(ValueError, match=NOT_BUILT[stem]):
        tiny_checkpoint(release, tmp_path / "tiny")
    assert not (tmp_path / "tiny").exists()
    given = tmp_path / "given"
    given.mkdir()  # an empty folder of the caller's stays, emptied again
    with pytest.raises(ValueError, match=NOT_BUILT[stem]):
        tiny_checkpoint(release, given)
    assert given.is_dir() and list(given.iterdir()) == []


@pytest.mark.parametrize("config", published_configs(), ids=lambda p: p.stem)
def test_every_published_config_builds_or_says_why(tmp_path: Path, config: Path) -> None:
    release = config.stem.partition("__")[2]
    if config.stem in NOT_BUILT:
        with pytest.raises(ValueError, match=NOT_BUILT[config.stem]):
            tiny_checkpoint(release, tmp_path / "tiny")
        return
    assert_mtp_intact(tiny_checkpoint(release, tmp_path / "tiny"))
