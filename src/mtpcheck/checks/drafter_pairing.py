"""A drafter against the target it is served with (``inspect DRAFTER --target TARGET``):
vocabulary, widths, the verifier it names, positions and rope, its embedding and head against
the target's, and a Gemma-4 assistant's layer types against the target's last layers.

Headers first: only the embedding and head comparisons read tensor bytes, and only where the
shapes already agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from mtpcheck.checks.findings import describe
from mtpcheck.families import MtpAnalysis
from mtpcheck.families.drafter_kinds import DrafterKind, Shared
from mtpcheck.families.drafters import DrafterConfig
from mtpcheck.families.layout import tied_head
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    Status,
    TensorComparison,
    TensorStatus,
)
from mtpcheck.model.config_keys import is_int, text_value

Compare = Callable[[Checkpoint, Checkpoint, Sequence[tuple[str, str]]], Sequence[TensorComparison]]

_EMBEDDINGS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight")
_HEAD = "lm_head.weight"
"""A target of no known family: where transformers' causal and vision-language models keep
the embedding and the head."""


@dataclass(frozen=True)
class Target:
    """What the pairing checks read of the target."""

    ckpt: Checkpoint
    vocab: int | None
    hidden: int | None
    layers: int | None
    positions: int | None
    rope: Any
    layer_types: tuple[str, ...]
    embedding: str | None
    head: str | None


def _int(config: Mapping[str, Any], key: str) -> int | None:
    found = text_value(config, key, is_int)
    return None if found is None else found[1]


def _rope(config: Mapping[str, Any]) -> Any:
    for key in ("rope_parameters", "rope_theta"):
        found = text_value(config, key)
        if found is not None:
            return found[1]
    return None


def target_of(ckpt: Checkpoint, analysis: MtpAnalysis) -> Target:
    """The target's quantities, read from its config and tensor names."""
    config, names = ckpt.config, ckpt.tensors
    family = analysis.family
    if family is not None:
        embeddings, heads = family.layout.main_shared[:1], family.layout.main_shared[1:]
    else:
        embeddings, heads = _EMBEDDINGS, (_HEAD,)
    embedding = next((n for n in embeddings if n in names), None)
    head = embedding if tied_head(config) else next((n for n in heads if n in names), None)
    types = text_value(config, "layer_types", lambda v: isinstance(v, list))
    return Target(
        ckpt=ckpt,
        vocab=_int(config, "vocab_size"),
        hidden=_int(config, "hidden_size"),
        layers=analysis.num_hidden_layers or _int(config, "num_hidden_layers"),
        positions=_int(config, "max_position_embeddings"),
        rope=_rope(config),
        layer_types=tuple(map(str, types[1])) if types else (),
        embedding=embedding,
        head=head,
    )


def _same(name: str, mine: object, theirs: object, fail: str) -> Finding:
    if mine is None or theirs is None:
        return Finding(name, Status.SKIP, f"not compared: drafter {mine}, target {theirs}")
    if mine == theirs:
        return Finding(name, Status.PASS, f"{mine}, as the target's")
    return Finding(name, Status.FAIL, f"drafter {mine}, target {theirs}: {fail}")


def _tokenizers(tables: tuple[str | None, str | None]) -> Finding | None:
    """The two tokenizers' token tables, where both sides ship one."""
    mine, theirs = tables
    if mine is None or theirs is None:
        return None
    if mine == theirs:
        return Finding("tokenizer", Status.PASS, "the same token table as the target's")
    return Finding(
        "tokenizer",
        Status.FAIL,
        "the drafter's tokenizer.json holds another token table than the target's: vLLM never "
        "loads the drafter's, so its drafts name other tokens",
    )


def shape_check(
    kind: DrafterKind,
    cfg: DrafterConfig,
    target: Target,
    tokenizers: tuple[str | None, str | None] = (None, None),
) -> CheckResult:
    """Vocabulary, tokenizer (where both ship one) and width against the target's."""
    findings = [
        _same(
            "vocabulary",
            cfg.vocab,
            target.vocab,
            "trained on another vocabulary; engines load it and its drafts are garbled",
        ),
        _same(
            "width",
            cfg.target_hidden,
            target.hidden,
            "built for another model's hidden states; the engine refuses it or drafts from "
            "the wrong features",
        ),
    ]
    tokenizer = _tokenizers(tokenizers)
    if tokenizer is not None:
        findings.insert(1, tokenizer)
    if kind.reads_target_kv:
        findings.append(_layer_types(cfg, target))
    return CheckResult(
        CheckName.PAIRING_SHAPE, "Drafter and target: vocabulary and width", tuple(findings)
    )


def _layer_types(cfg: DrafterConfig, target: Target) -> Finding:
    """A Gemma-4 assistant reads the KV cache of the target's last layers of each type."""
    mine = cfg.layer_types
    if not mine or not target.layer_types:
        return Finding("layer_types", Status.SKIP, "not compared: a side names no layer types")
    last = set(target.layer_types[-2:])
    foreign = sorted(set(mine) - last)
    if foreign:
        return Finding(
            "layer_types",
            Status.FAIL,
            f"{foreign} not among the target's last two layers' types {sorted(last)}: there "
            "is no KV cache of that type for it to read (SGLang refuses it)",
        )
    return Finding("layer_types", Status.PASS, f"among the target's last layers' {sorted(last)}")


def _name(path: str) -> str:
    return PurePosixPath(path.rstrip("/").split("@")[0]).name


def verifier_check(cfg: DrafterConfig, target: Target) -> CheckResult | None:
    """The target speculators recorded the drafter was trained for."""
    if cfg.verifier is None:
        return None
    findings = []
    archs = cfg.verifier.get("architectures")
    theirs = target.ckpt.config.get("architectures")
    if isinstance(archs, list) and isinstance(theirs, list):
        if set(map(str, archs)) & set(map(str, theirs)):
            findings.append(Finding("architectures", Status.PASS, f"{archs}, as the target's"))
        else:
            findings.append(
                Finding(
                    "architectures",
                    Status.FAIL,
                    f"the drafter was trained for {archs}, the target is {theirs}",
                )
            )
    named = cfg.verifier.get("name_or_path")
    if isinstance(named, str):
        same = _name(named) == _name(target.ckpt.path)
        findings.append(
            Finding(
                "name_or_path",
                Status.PASS if same else Status.INFO,
                f"{named!r}"
                + ("" if same else f", not the target's name {_name(target.ckpt.path)!r}")
                + "; no revision is recorded: `vllm serve DRAFTER` loads whatever it names",
            )
        )
    if not findings:
        return None
    return CheckResult(
        CheckName.PAIRING_VERIFIER, "Verifier the drafter was trained for", tuple(findings)
    )


def positions_check(cfg: DrafterConfig, target: Target) -> CheckResult | None:
    """Positions and rope: a drafter shorter than its target's context, or rotated
    otherwise, drafts poorly past its length or everywhere."""
    findings = []
    if cfg.positions is not None and target.positions is not None:
        if cfg.positions < target.positions:
            findings.append(
                Finding(
                    "max_position_embeddings",
                    Status.WARN,
                    f"drafter {cfg.positions} < target {target.positions}: past it the drafter "
                    "runs outside the positions it was built for",
                )
            )
        else:
            findings.append(Finding("max_position_embeddings", Status.PASS, f"{cfg.positions}"))
    if cfg.rope is not None and target.rope is not None:
        if cfg.rope == target.rope:
            findings.append(Finding("rope", Status.PASS, "the target's"))
        else:
            findings.append(
                Finding("rope", Status.WARN, f"drafter {cfg.rope!r}, target {target.rope!r}")
            )
    if not findings:
        return None
    return CheckResult(CheckName.PAIRING_POSITIONS, "Positions and rope", tuple(findings))


def _copy_finding(what: str, c: TensorComparison, frozen: bool, own_note: str) -> Finding:
    if c.status is TensorStatus.EQUAL:
        return Finding(what, Status.PASS, f"an identical copy of the target's ({c.nbytes} bytes)")
    if c.status is TensorStatus.NOT_COMPARED:
        return Finding(what, Status.SKIP, "not compared: bytes not at hand (--fetch reads them)")
    differs = describe(c, "target", "drafter")
    if frozen:
        return Finding(
            what,
            Status.FAIL,
            f"its config says it is the target's, but it differs ({differs}): vLLM keeps the "
            "drafter's own, SGLang takes the target's",
        )
    return Finding(what, Status.WARN, f"the drafter's own ({differs}): {own_note}")


def embedding_check(
    drafter: Checkpoint,
    kind: DrafterKind,
    cfg: DrafterConfig,
    target: Target,
    compare: Compare,
    frozen: bool,
) -> CheckResult:
    """The drafter's embedding and head: absent, identical to the target's, or its own."""
    findings = []
    for what, mine, theirs in (
        ("embed_tokens.weight", "embed_tokens.weight", target.embedding),
        ("lm_head.weight", "lm_head.weight", target.head),
    ):
        if mine not in drafter.tensors:
            findings.append(Finding(what, Status.PASS, "absent: the engines use the target's"))
            continue
        if theirs is None:
            findings.append(Finding(what, Status.SKIP, "the target holds none to compare"))
            continue
        if drafter.tensors[mine].shape != target.ckpt.tensors[theirs].shape:
            findings.append(
                Finding(
                    what,
                    Status.INFO,
                    f"the drafter's own, shaped "
                    f"{list(drafter.tensors[mine].shape)} (target's {theirs}: "
                    f"{list(target.ckpt.tensors[theirs].shape)})",
                )
            )
            continue
        c = compare(target.ckpt, drafter, [(theirs, mine)])[0]
        own = (
            "vLLM drafts with it, SGLang with the target's: the two serve different drafters"
            if kind.shared is Shared.OWN_OR_TARGET
            else "the engines use the target's"
        )
        findings.append(_copy_finding(what, c, frozen and what.startswith("embed"), own))
    return CheckResult(
        CheckName.PAIRING_EMBEDDING, "Embedding and head against the target's", tuple(findings)
    )
