"""Every check a report can hold, by name: the registry of check names.

Each :class:`CheckName` member is one name a command reports (its value is the name the
table, JSON, JUnit and Markdown reports print); :data:`CHECKS` says, for each, what it checks,
which commands report it and where the docs list it. Checks build their
:class:`~mtpcheck.model.CheckResult` from a member, never from a quoted name, and the docs'
check tables and the JSON Schema's enum of names are generated from here.

Two names are derived from others, and both derivations yield members:

- ``roundtrip`` audits its source with every ``inspect`` check first and reports each as
  ``source-NAME`` (:meth:`CheckName.source`);
- ``accept`` reports one ``acceptance`` check per workload, printed ``acceptance/WORKLOAD``
  (:attr:`CheckResult.workload <mtpcheck.model.CheckResult.workload>`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

Command = Literal["inspect", "diff", "roundtrip", "convert", "accept"]
"""A command that reports checks (``convert`` names its gate's check when it refuses)."""

CheckGroup = Literal["checkpoint", "drafter", "diff", "roundtrip", "source", "accept"]
"""Where the docs list a check: a model checkpoint's, a drafter's, ``diff``'s, ``roundtrip``'s
stages, ``roundtrip``'s source audit, ``accept``'s."""

SOURCE_PREFIX: Final = "source-"
"""What ``roundtrip`` puts before an ``inspect`` check's name when it audits its source."""


class CheckName(str, enum.Enum):
    """The name of a check (a ``str``: it compares equal to, and prints as, the plain name).

    What each checks and the commands that report it: :data:`CHECKS`, or :attr:`doc` and
    :attr:`commands` of a member.
    """

    # a model checkpoint's own checks (inspect; diff and roundtrip share some)
    INTEGRITY = "integrity"
    FAMILY = "family"
    MAIN_MODEL = "main-model"
    MTP_COUNT = "mtp-count"
    MTP_LAYERS = "mtp-layers"
    MTP_SHAPES = "mtp-shapes"
    SHARED_COPIES = "shared-copies"
    MTP_TRAINED = "mtp-trained"
    SERVING = "serving"
    MTP_QUANTIZATION = "mtp-quantization"
    MCORE_MODEL = "mcore-model"
    # a drafter's (inspect, with or without --target)
    DRAFTER_KIND = "drafter-kind"
    DRAFTER_TENSORS = "drafter-tensors"
    DRAFTER_TAPS = "drafter-taps"
    DRAFTER_VOCAB = "drafter-vocab"
    PAIRING = "pairing"
    PAIRING_SHAPE = "pairing-shape"
    PAIRING_EMBEDDING = "pairing-embedding"
    PAIRING_VERIFIER = "pairing-verifier"
    PAIRING_POSITIONS = "pairing-positions"
    DRAFTER_MTP = "drafter-mtp"
    DRAFTER_SERVING = "drafter-serving"
    # diff's
    CONFIG = "config"
    TENSORS = "tensors"
    SCOPE = "scope"
    # roundtrip's stages
    STAGE1_CONVERT = "stage1-convert"
    STAGE1_MTP_COUNT = "stage1-mtp-count"
    STAGE1_TENSORS = "stage1-tensors"
    STAGE2_CONVERT = "stage2-convert"
    ROUNDTRIP_TENSORS = "roundtrip-tensors"
    FINAL_MAIN_MODEL = "final-main-model"
    FINAL_MTP_COUNT = "final-mtp-count"
    STAGE1 = "stage1"
    STAGE2 = "stage2"
    OUTPUT = "output"
    # roundtrip's source audit: SOURCE_PREFIX + an inspect check's name (CheckName.source)
    SOURCE_INTEGRITY = "source-integrity"
    SOURCE_FAMILY = "source-family"
    SOURCE_MAIN_MODEL = "source-main-model"
    SOURCE_MTP_COUNT = "source-mtp-count"
    SOURCE_MTP_LAYERS = "source-mtp-layers"
    SOURCE_MTP_SHAPES = "source-mtp-shapes"
    SOURCE_SHARED_COPIES = "source-shared-copies"
    SOURCE_MTP_TRAINED = "source-mtp-trained"
    SOURCE_SERVING = "source-serving"
    SOURCE_MTP_QUANTIZATION = "source-mtp-quantization"
    SOURCE_MCORE_MODEL = "source-mcore-model"
    SOURCE_DRAFTER_KIND = "source-drafter-kind"
    SOURCE_DRAFTER_TENSORS = "source-drafter-tensors"
    SOURCE_DRAFTER_TAPS = "source-drafter-taps"
    SOURCE_DRAFTER_VOCAB = "source-drafter-vocab"
    SOURCE_PAIRING = "source-pairing"
    SOURCE_DRAFTER_SERVING = "source-drafter-serving"
    # accept's
    ACCEPTANCE = "acceptance"
    SERVED_COPIES = "served-copies"

    def __str__(self) -> str:
        """The plain name, so f-strings and ``str()`` print what reports always printed."""
        return str(self.value)

    @property
    def doc(self) -> str:
        """What the check checks (the docs' tables print it)."""
        return CHECKS[self].doc

    @property
    def commands(self) -> tuple[Command, ...]:
        """The commands that report it."""
        return CHECKS[self].commands

    def source(self) -> CheckName:
        """``roundtrip``'s form of this ``inspect`` check run on its source: ``source-NAME``
        (a ValueError for a check with no such form)."""
        return CheckName(SOURCE_PREFIX + self.value)


@dataclass(frozen=True)
class CheckInfo:
    """What the registry records of one check name."""

    doc: str
    """What it checks (Markdown: the docs' tables print it as it is)."""
    commands: tuple[Command, ...]
    """The commands that report it."""
    group: CheckGroup
    """Where the docs list it."""


_N = CheckName
_MODEL: Final[tuple[Command, ...]] = ("inspect", "roundtrip")
"""A model checkpoint's own checks: ``inspect``'s, and ``roundtrip --to-drafter``'s audit of
its source (``roundtrip`` reports them as ``source-NAME`` otherwise)."""
_SHARED: Final[tuple[Command, ...]] = ("inspect", "diff", "roundtrip")

_OWN: Final[dict[CheckName, CheckInfo]] = {
    _N.INTEGRITY: CheckInfo(
        "headers are valid and the index agrees with the shards: no missing shard, no tensor "
        "the index names but no shard holds, no tensor in two shards, no shard or tensor the "
        "index ignores, no truncated shard (the tensors it cuts off are named). The passing "
        "line says what was cross-checked: `headers and index`, one `header`, `headers (no "
        "index)`, or a Megatron checkpoint's `.metadata and the data files`",
        _SHARED,
        "checkpoint",
    ),
    _N.FAMILY: CheckInfo(
        "the `model_type` is a known MTP family (an unknown one is a warning: MTP tensors are "
        "then found by name heuristics)",
        _MODEL,
        "checkpoint",
    ),
    _N.MAIN_MODEL: CheckInfo(
        "the main model is whole against its config: every decoder layer the config declares "
        "holds tensors, each holds what the other layers of its kind hold (names and shapes), "
        "every routed expert of an MoE layer is there with each of its projections, and the "
        "embedding, final norm and (unless tied) head are present, the embedding and head "
        "`[vocab_size, hidden_size]` in HF names (`diff`: A's and B's, each)",
        _SHARED,
        "checkpoint",
    ),
    _N.MTP_COUNT: CheckInfo(
        "declared count == number of complete MTP layers present. Weights present but "
        "undeclared (key 0 or absent) fail too: serving engines read the key",
        _MODEL,
        "checkpoint",
    ),
    _N.MTP_LAYERS: CheckInfo(
        "each MTP layer holds its MTP-only tensors (norms, projection, shared copies where "
        "required) and the full tensor set of the main decoder layer it mirrors (so an MTP "
        "layer missing half its experts is incomplete), every one of them readable (a tensor "
        "a truncated shard cuts off makes its layer incomplete), and the main embedding and "
        "output head it drafts through are there (the head unless the config ties it to the "
        "embedding)",
        _MODEL,
        "checkpoint",
    ),
    _N.MTP_SHAPES: CheckInfo(
        "MTP tensors have the shapes the config implies: the projection `[hidden_size, 2 * "
        "hidden_size]` (`[H, H]` for split projections), the MTP head's norms "
        "`[hidden_size]`, and each tensor of an MTP block the shape of the same tensor in the "
        "main layer it mirrors (a transposed `eh_proj` fails here, though its name is right)",
        _MODEL,
        "checkpoint",
    ),
    _N.SHARED_COPIES: CheckInfo(
        "MTP copies of main tensors (e.g. `model.layers.61.embed_tokens.weight` vs "
        "`model.embed_tokens.weight`) are bit-identical to them (a copy whose bytes are cut "
        'off is "not compared", a failure, not "diverged")',
        _MODEL,
        "checkpoint",
    ),
    _N.MTP_TRAINED: CheckInfo(
        "each MTP layer was trained, not initialised or copied", _MODEL, "checkpoint"
    ),
    _N.SERVING: CheckInfo(
        "a serving engine builds from this config what transformers builds", _MODEL, "checkpoint"
    ),
    _N.MTP_QUANTIZATION: CheckInfo(
        "quantized checkpoints only: each MTP layer is stored as the config tells a serving "
        "engine to build it",
        _MODEL,
        "checkpoint",
    ),
    _N.MCORE_MODEL: CheckInfo(
        "the main model as megatron-core's GPTModel of the config holds it: `convert`'s gate "
        "on its input and output (named when it refuses), and `roundtrip`'s on its source "
        "(`source-mcore-model`)",
        ("convert",),
        "checkpoint",
    ),
    **{
        name: CheckInfo(doc, ("inspect",), "drafter")
        for name, doc in (
            (_N.DRAFTER_KIND, "the kind, its width, and what is and is not checked of it"),
            (
                _N.DRAFTER_TENSORS,
                "every tensor the kind holds, and every flag against its tensor: "
                "`norm_before_fc` with `input_norm.weight`, `fc_norm` with `fc_norm.{i}.weight`, "
                "`mask_token_id` with `mask_hidden` (a flag without its tensor, or a tensor "
                "without its flag, fails); `fc.weight`'s input width = taps x the target's "
                "width; the Gemma-4 assistant's projections and `num_centroids`",
            ),
            (
                _N.DRAFTER_TAPS,
                "the taps present, increasing and, with `--target`, inside the target's layers. "
                "A missing key fails and names the default each reader falls back to: `(2, n // "
                "2, n - 3)` in vLLM 0.32, speculators and llama.cpp's converter 0.3.36",
            ),
            (
                _N.DRAFTER_VOCAB,
                "`d2t` and `t2d`, both or neither. `d2t` is one entry per draft token and `t2d` "
                "one per target token. The target ids `i + d2t[i]` must be strictly increasing "
                "and inside the target vocabulary, and not all zero when the draft vocabulary "
                "is smaller. `t2d` must mark exactly those ids. A reduced draft vocabulary "
                "without maps fails: vLLM then maps draft id i to target id i",
            ),
            (
                _N.PAIRING,
                "without `--target`: one SKIP naming what is not checked without the target "
                "(vocabulary, widths, taps, embedding and head, or the extracted MTP layer)",
            ),
            (
                _N.PAIRING_SHAPE,
                "vocabulary size and the width the drafter was built for, against the "
                "target's; a Gemma-4 assistant's layer types against the target's last two "
                "layers'",
            ),
            (
                _N.PAIRING_EMBEDDING,
                "the drafter's embedding and head: absent (the target's are used), an "
                "identical copy, or its own. A drafter whose config says its embedding is the "
                "target's, frozen (speculators' `embed_requires_grad: false`), but whose "
                "embedding differs fails: vLLM keeps the drafter's, SGLang takes the target's. "
                "Otherwise a differing copy warns",
            ),
            (
                _N.PAIRING_VERIFIER,
                "`speculators_config.verifier` against the target: the architectures must "
                "agree. The name is shown; no revision is recorded, so a drafter served with "
                "another revision of its target cannot be told from the files",
            ),
            (
                _N.PAIRING_POSITIONS,
                "`max_position_embeddings` shorter than the target's, or another rope: WARN",
            ),
            (
                _N.DRAFTER_SERVING,
                "how to serve the pair: INFO, with the setting alone in each finding's "
                "`details` for the JSON report",
            ),
        )
    },
    _N.DRAFTER_MTP: CheckInfo(
        "an extracted MTP layer (NextN export, speculators MTP, a standalone head) against the "
        "target's own MTP layer, bit for bit, in the drafter's names. speculators' fused "
        "experts are compared slice by slice. Tensors the exporter leaves out on purpose are "
        "listed, not failed: NextN drops the embedding and `shared_head.head`, speculators "
        "stores `verifier_lm_head.weight` and never reads it. Anything else of the layer that "
        "is missing fails",
        _SHARED,
        "drafter",
    ),
    _N.CONFIG: CheckInfo(
        "the two configs key by key: a changed MTP count or structural key fails, any other "
        "changed key is listed (across naming schemes only the keys both spell alike; "
        "`roundtrip`: the final config against the source's)",
        ("diff", "roundtrip"),
        "diff",
    ),
    _N.TENSORS: CheckInfo(
        "the tensor matcher: every tensor in scope (the MTP layers and what they draft "
        "through; `--all`: every tensor) has the same dtype, shape and bytes on both sides "
        "(`--dequantize`: a quantized side's values within its quantization step)",
        ("diff", "roundtrip"),
        "diff",
    ),
    _N.SCOPE: CheckInfo(
        "INFO: what a `diff` of a target and an MTP layer taken out of it compares (the "
        "drafter's tensors against the target's MTP layer)",
        ("diff",),
        "diff",
    ),
    **{
        name: CheckInfo(doc, ("roundtrip",), "roundtrip")
        for name, doc in (
            (
                _N.STAGE1_CONVERT,
                "the stage 1 converter (HF -> Megatron) ran and exited 0; SKIP when the source "
                "fails its audit",
            ),
            (
                _N.STAGE1_MTP_COUNT,
                "the Megatron checkpoint declares as many MTP layers as the source",
            ),
            (
                _N.STAGE1_TENSORS,
                "the Megatron tensors against what a correct conversion of the source holds",
            ),
            (_N.STAGE2_CONVERT, "the stage 2 converter (Megatron -> HF) ran and exited 0"),
            (
                _N.ROUNDTRIP_TENSORS,
                "the final tensors against the source's, bit for bit, each loss blamed on the "
                "stage that lost it",
            ),
            (
                _N.FINAL_MAIN_MODEL,
                "`main-model` of the final checkpoint: its main model whole against its own "
                "config, whatever the scope",
            ),
            (
                _N.FINAL_MTP_COUNT,
                "`mtp-count` of the final checkpoint: what a serving engine will read",
            ),
            (
                _N.STAGE1,
                "`--to-drafter`: the command taking the MTP layer out into a drafter format "
                "ran and exited 0",
            ),
            (
                _N.STAGE2,
                "`--from-drafter`: the command writing the drafter back into the target ran "
                "and exited 0",
            ),
            (_N.OUTPUT, "a converter that exited 0 left a checkpoint mtpcheck can open"),
        )
    },
    _N.ACCEPTANCE: CheckInfo(
        "`acceptance/WORKLOAD`, one per workload: how often the MTP layers' (or a drafter's) "
        "drafts are accepted on it, teacher-forced, online, by vLLM or by a running server; it "
        "fails below `--min-acceptance`, and a server's below what the checkpoint accepts "
        "offline or below a saved `--profile`",
        ("accept",),
        "accept",
    ),
    _N.SERVED_COPIES: CheckInfo(
        "a stored copy of the embedding or head that the figures draft through differs from "
        "its main tensor",
        ("accept",),
        "accept",
    ),
}

SOURCED: Final[tuple[CheckName, ...]] = (
    *(n for n, info in _OWN.items() if info.group == "checkpoint"),
    *(_N.DRAFTER_KIND, _N.DRAFTER_TENSORS, _N.DRAFTER_TAPS, _N.DRAFTER_VOCAB, _N.PAIRING),
    _N.DRAFTER_SERVING,
)
"""The checks ``roundtrip`` runs on its source, each reported as ``source-NAME``: every check
``inspect`` reports without ``--target`` (a drafter given as the source gets a drafter's), and
``mcore-model``."""

CHECKS: Final[Mapping[CheckName, CheckInfo]] = {
    **_OWN,
    **{
        n.source(): CheckInfo(
            f"`{n}` of the source, before anything is converted: a source that fails one is "
            "not converted",
            ("roundtrip",),
            "source",
        )
        for n in SOURCED
    },
}
"""Every check name: what it checks, the commands that report it, where the docs list it."""
