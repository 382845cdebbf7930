"""What ``roundtrip`` and ``convert`` are asked to do: their options declared once, here (the
CLI's parameters and the API's keywords both come from these fields). Light: no converter,
reader or torch is imported."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtpcheck.checks.options import megatron_layout_option
from mtpcheck.declared import (
    UsageError,
    argument,
    bad_value,
    check_fields,
    internal,
    option,
    required_option,
    silent,
)
from mtpcheck.layouts import MegatronLayout

DRAFTER_PLACEHOLDER = "{drafter}"
"""Where the drafter round trip's second command takes the drafter the first one wrote."""


@dataclass(frozen=True)
class RoundtripOptions:
    """Everything a round trip needs."""

    source: Path = argument("The HF checkpoint to round-trip.", path="any", metavar="PATH")
    to_megatron: str | None = option(
        None,
        "Your HF->Megatron converter, e.g. 'python conv.py --in {src} --out {dst}'. "
        "Default: the built-in converter.",
        metavar="CMD",
    )
    to_hf: str | None = option(
        None,
        "Your Megatron->HF converter with {src} and {dst}. Default: built-in.",
        metavar="CMD",
    )
    to_drafter: str | None = option(
        None,
        "Instead of Megatron: a command taking the MTP layer out into a drafter format, with "
        "{src} and {dst} (speculators' 'speculators convert {src} --algorithm mtp ...').",
        metavar="CMD",
    )
    from_drafter: str | None = option(
        None,
        "With --to-drafter: the command writing that drafter back into the target, with "
        "{src} (the target), {drafter} and {dst} ('speculators stitch-mtp {drafter} {src} "
        "--output-path {dst}').",
        metavar="CMD",
    )
    workdir: Path | None = option(
        None,
        "Where temporary checkpoints go (default: the system temp dir). Under torchrun "
        "across nodes it must be on a file system every node sees.",
        path="dir",
    )
    keep: bool = option(False, "Keep the temporary checkpoints and say where.", bool)
    timeout: float | None = option(
        None, "Time limit per converter command.", float, metavar="SECONDS"
    )
    all_tensors: bool = option(
        False,
        "Compare every tensor of the final checkpoint, not only the MTP scope.",
        bool,
        flag="--all",
    )
    synthetic: bool = option(
        False, "Round-trip a tiny random checkpoint built from PATH's config.json.", bool
    )
    megatron_layout: MegatronLayout = megatron_layout_option()
    trust_pickle: bool = internal(False)
    """Unpickle Megatron files without the allowlist (the CLI's ``--trust-pickle``)."""
    log: Callable[[str], None] = internal(silent)
    """Where progress lines go (the CLI: stderr); dropped by default."""

    def __post_init__(self) -> None:
        """The source as a Path, also when given as a str."""
        object.__setattr__(self, "source", Path(self.source))

    @property
    def via_drafter(self) -> bool:
        """The MTP layer out into a drafter format and back, instead of through Megatron."""
        return self.to_drafter is not None or self.from_drafter is not None

    def validate(self) -> None:
        """Refuse options that do not go together and converter commands without their
        placeholders (:class:`UsageError`, the CLI's exit 2)."""
        check_fields(self)
        if self.via_drafter:
            self._validate_drafter()
        for flag, template in (
            ("--to-megatron", self.to_megatron),
            ("--to-hf", self.to_hf),
            ("--to-drafter", self.to_drafter),
        ):
            if template is not None:
                _checked_template(flag, template, ("{src}", "{dst}"))

    def _validate_drafter(self) -> None:
        """Both drafter commands, none of the Megatron trip's."""
        if self.to_drafter is None or self.from_drafter is None:
            raise UsageError("--to-drafter and --from-drafter go together")
        clashing = (
            ("--to-megatron", self.to_megatron is not None),
            ("--to-hf", self.to_hf is not None),
            ("--synthetic", self.synthetic),
        )
        clash = [flag for flag, given in clashing if given]
        if clash:
            raise UsageError(f"--to-drafter / --from-drafter do not go with {clash[0]}")
        _checked_template("--from-drafter", self.from_drafter, STITCH_PLACEHOLDERS)


STITCH_PLACEHOLDERS = ("{src}", DRAFTER_PLACEHOLDER, "{dst}")
"""What the drafter round trip's second command names: the target, the drafter, the output."""


def validate_template(template: str, placeholders: tuple[str, ...] = ("{src}", "{dst}")) -> None:
    """A converter template must name each of its ``placeholders`` (``{src}`` and ``{dst}``)."""
    missing = [p for p in placeholders if p not in template]
    if missing:
        raise ValueError(f"converter command {template!r} lacks {' and '.join(missing)}")


def _checked_template(flag: str, template: str, placeholders: tuple[str, ...]) -> None:
    """A converter command naming each of ``placeholders``, else a usage error naming it."""
    try:
        validate_template(template, placeholders)
    except ValueError as e:
        raise bad_value(flag, str(e)) from e


@dataclass(frozen=True)
class HfToMegatronOptions:
    """``convert hf-to-megatron``: the built-in converter's source and destination."""

    src: Path = argument("The HF safetensors checkpoint.", path="any")
    dst: Path = argument("Where the Megatron torch_dist checkpoint is written.", path="any")
    log: Callable[[str], None] = internal(silent)
    """Where progress lines go (the CLI: stderr); dropped by default."""

    def validate(self) -> None:
        """Nothing goes together here beyond the two paths."""
        check_fields(self)


@dataclass(frozen=True)
class MegatronToHfOptions:
    """``convert megatron-to-hf``: the built-in converter's source, destination and the HF
    config the result must back."""

    src: Path = argument("The Megatron torch_dist or legacy checkpoint.", path="any")
    dst: Path = argument("Where the HF safetensors checkpoint is written.", path="any")
    hf_config: Path = required_option(
        "config.json of the HF model the Megatron checkpoint holds, or the folder holding it "
        "(as roundtrip --synthetic takes).",
        path="any",
    )
    copies: bool = option(
        True,
        "Re-create the MTP copies of embedding and head where the family stores them.",
        bool,
        flag="--copies/--no-copies",
    )
    trust_pickle: bool = internal(False)
    """Unpickle Megatron files without the allowlist."""
    log: Callable[[str], None] = internal(silent)
    """Where progress lines go (the CLI: stderr); dropped by default."""

    def validate(self) -> None:
        """Nothing goes together here beyond the paths."""
        check_fields(self)

    @property
    def config_file(self) -> Path:
        """The HF config.json itself (``hf_config`` may name its folder)."""
        return self.hf_config / "config.json" if self.hf_config.is_dir() else self.hf_config
