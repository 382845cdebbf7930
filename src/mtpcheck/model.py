"""Core data types: tensor metadata, the checkpoint contract and the report.

This module is the leaf of the package: it imports nothing from mtpcheck and only the
standard library, so every other layer can depend on it.
"""

from __future__ import annotations

import enum
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ByteSpan:
    """``length`` bytes at ``offset`` of ``file``: a tensor's bytes lie in one or more, in C
    order (checkpoints that know this offer ``byte_spans(name)``; writers copy them in the
    kernel)."""

    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lives on disk, as its file header declares it."""

    name: str
    dtype: str
    """A code of the dtype registry (:mod:`mtpcheck.dtypes`): the safetensors code, e.g.
    ``BF16`` or ``F8_E4M3``, or a GGML block type such as ``Q4_K``; a reader's ``torch.<name>``
    for a torch dtype the registry lacks."""
    shape: tuple[int, ...]
    file: str
    """Path of the file holding the bytes."""
    offset: int
    """Absolute byte offset of the first data byte in ``file``."""
    nbytes: int
    readable: bool = True
    """False when the file ends before the tensor's last byte (a truncated shard)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class TensorColumns:
    """The tensors of one file, column by column in header order (one object per file, not
    per tensor: a DeepSeek-V3 checkpoint declares 92k tensors)."""

    file: str
    file_size: int
    """Bytes the file holds; a tensor ending past it is unreadable."""
    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    offsets: array
    """Absolute byte offset of each tensor's first byte (``array('q')``)."""
    sizes: array
    """Bytes of each tensor (``array('q')``)."""

    def meta(self, i: int, name: str) -> TensorMeta:
        offset = self.offsets[i]
        nbytes = self.sizes[i]
        return TensorMeta(
            name=name,
            dtype=self.dtypes[i],
            shape=self.shapes[i],
            file=self.file,
            offset=offset,
            nbytes=nbytes,
            readable=offset + nbytes <= self.file_size,
        )


class TensorTable(Mapping[str, TensorMeta]):
    """Tensor metadata of several files as one mapping in name order, kept in their columns:
    a :class:`TensorMeta` is built when a name is looked up. Names must be unique across the
    files (:meth:`of` returns None otherwise)."""

    __slots__ = ("_parts", "_starts", "_position", "_sorted")

    def __init__(
        self, parts: list[TensorColumns], starts: list[int], position: dict[str, int]
    ) -> None:
        self._parts = parts
        self._starts = starts  # each part's first position in the columns laid end to end
        self._position = position
        self._sorted: list[str] | None = None

    @classmethod
    def of(cls, parts: Iterable[TensorColumns]) -> TensorTable | None:
        """The table of ``parts``, or None when a name occurs twice."""
        parts = list(parts)
        starts = [0, *accumulate(len(part.names) for part in parts)]
        position: dict[str, int] = {}
        for part, start in zip(parts, starts[:-1], strict=True):
            position.update(zip(part.names, range(start, start + len(part.names)), strict=True))
        unique = len(position) == starts[-1]
        return cls(parts, starts[:-1], position) if unique else None

    def __getitem__(self, name: str) -> TensorMeta:
        i = self._position[name]
        k = bisect_right(self._starts, i) - 1
        return self._parts[k].meta(i - self._starts[k], name)

    def get(self, name: str, default: TensorMeta | None = None) -> TensorMeta | None:  # type: ignore[override]
        return self[name] if name in self._position else default

    def __contains__(self, name: object) -> bool:
        return name in self._position

    def __iter__(self) -> Iterator[str]:
        if self._sorted is None:
            self._sorted = sorted(self._position)
        return iter(self._sorted)

    def __len__(self) -> int:
        return len(self._position)

    def __repr__(self) -> str:
        return f"TensorTable({len(self)} tensors in {len(self._parts)} files)"

    @property
    def parts(self) -> tuple[TensorColumns, ...]:
        return tuple(self._parts)


def total_nbytes(tensors: Mapping[str, TensorMeta]) -> int:
    """Bytes of all ``tensors`` (summed column by column for a :class:`TensorTable`)."""
    if isinstance(tensors, TensorTable):
        return sum(sum(part.sizes) for part in tensors.parts)
    return sum(m.nbytes for m in tensors.values())


def files_of(tensors: Mapping[str, TensorMeta]) -> set[str]:
    """The files holding ``tensors``."""
    if isinstance(tensors, TensorTable):
        return {part.file for part in tensors.parts if part.names}
    return {m.file for m in tensors.values()}


@dataclass(frozen=True)
class IntegrityIssue:
    """A structural problem a reader found while opening a checkpoint (not fatal)."""

    kind: str
    """Short machine name, e.g. ``missing-shard`` or ``tensor-in-two-shards``."""
    subject: str
    message: str


class Naming(str, enum.Enum):
    """Which tensor names a checkpoint uses (what a cross-format comparison maps between)."""

    HF = "hf"
    """Hugging Face names (``model.layers.{k}.self_attn.q_proj.weight``)."""
    MEGATRON = "megatron"
    """megatron-core's ``GPTModel.state_dict()`` names (``decoder.layers.{k}...``)."""
    GGUF = "gguf"
    """llama.cpp's names (``blk.{k}.attn_q.weight``, ``blk.{n}.nextn.eh_proj.weight``)."""


@runtime_checkable
class Checkpoint(Protocol):
    """An opened checkpoint, whatever its on-disk format."""

    path: str
    format: str
    """Format name, e.g. ``hf-safetensors``."""
    naming: Naming
    config: Mapping[str, Any]
    """Parsed model config (``{}`` when the checkpoint ships none)."""
    config_path: str | None
    tensors: Mapping[str, TensorMeta]
    """Every tensor the checkpoint holds, by its native name."""
    issues: tuple[IntegrityIssue, ...]
    cross_checked: str
    """What the reader checked against each other when it opened the checkpoint, in words
    (``headers and index``, ``a single header``): the integrity check's "consistent" line."""

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """Yield the raw bytes of tensor ``name`` in order, ``chunk_bytes`` at a time (the last
        chunk may be shorter)."""
        ...


@runtime_checkable
class HasByteSpans(Protocol):
    """A checkpoint that can say where a tensor's bytes lie in its files (writers then copy
    them file to file, in the kernel)."""

    def byte_spans(self, name: str) -> list[ByteSpan] | None:
        """The tensor's bytes as file ranges in C order; None when they must be computed."""
        ...


@runtime_checkable
class ReadsSlices(Protocol):
    """Reads bytes ``start .. start + length`` of a tensor alone (one of stacked experts),
    chunked as ``read_chunks``."""

    def read_slice_chunks(
        self, name: str, start: int, length: int, size: int
    ) -> Iterator[bytes]: ...


@runtime_checkable
class HasSpanReader(Protocol):
    """A checkpoint whose tensors lie at plain file offsets (``TensorMeta.file`` and
    ``offset``), read by positioned reads: the tensor matcher's fast path."""

    def span_reader(self) -> Any:
        """A context manager giving a reader of ``(file, offset, length)`` ranges."""
        ...


@runtime_checkable
class Prefetches(Protocol):
    """A checkpoint read over the network, which fetches a batch of tensors at once."""

    def prefetch(self, names: list[str]) -> None: ...


@runtime_checkable
class DeclaresQuantization(Protocol):
    """A checkpoint with a quantization description beside its config (NVIDIA modelopt's
    ``hf_quant_config.json``); None when the checkpoint has none."""

    @property
    def quant_config(self) -> Mapping[str, Any] | None: ...


@runtime_checkable
class HeadersOnly(Protocol):
    """A checkpoint known by its headers, whose tensor bytes may not be at hand (a Hub
    repository): ``why_no_bytes`` is empty when they can be read."""

    @property
    def why_no_bytes(self) -> str: ...

    def file_sha256(self, file: str) -> str | None:
        """The sha256 of the whole file ``file`` (``TensorMeta.file``), where known for free."""
        ...


class Status(str, enum.Enum):
    """Outcome of one check or finding. Only FAIL makes a verdict fail."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One observation of a check about one subject (a tensor, a key, a layer)."""

    subject: str
    status: Status
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckResult:
    """The findings of one named check; it fails when any finding fails."""

    name: str
    title: str
    findings: tuple[Finding, ...]

    @property
    def status(self) -> Status:
        statuses = {f.status for f in self.findings}
        for s in (Status.FAIL, Status.WARN, Status.PASS, Status.INFO):
            if s in statuses:
                return s
        return Status.SKIP


class TensorStatus(str, enum.Enum):
    """Verdict of the tensor matcher for one tensor name."""

    EQUAL = "equal"
    MISSING = "missing"
    EXTRA = "extra"
    SHAPE_CHANGED = "shape_changed"
    DTYPE_CHANGED = "dtype_changed"
    BITS_DIFFER = "bits_differ"
    UNREADABLE = "unreadable"
    NOT_COMPARED = "not_compared"
    """Same dtype and shape, bytes not at hand (a Hub repository read by its headers)."""
    QUANTIZED = "quantized"
    """One parameter stored in different forms, one of them quantized (BF16 in A, packed
    INT4 + scales in B): not comparable byte for byte; ``diff --dequantize`` compares values."""


@dataclass(frozen=True)
class TensorComparison:
    """Byte-level comparison of one tensor between two checkpoints."""

    name: str
    status: TensorStatus
    dtype: tuple[str | None, str | None]
    shape: tuple[tuple[int, ...] | None, tuple[int, ...] | None]
    nbytes: int = 0
    differing_elements: int = 0
    first_difference: tuple[int, ...] | None = None
    """Index (in the tensor's shape) of the first differing element."""
    max_abs_diff: float | None = None
    """Context only: the verdict is decided by bytes, never by this value."""
    storage: tuple[str, str] | None = None
    """QUANTIZED only: how each side stores the parameter (``BF16``, ``INT4: weight_packed
    I32 [8, 4] + weight_scale BF16 [8, 1]``)."""
    values_differing: int | None = None
    """DTYPE_CHANGED only, context: elements whose values differ once the narrower float type
    is widened exactly (0: every value survived the change); None: not such a pair of types."""
    steps: float | None = None
    """QUANTIZED, dequantized: the largest difference between B's dequantized values and A's,
    in units of B's quantization step there (at most about 0.5 when B rounds A)."""


@dataclass(frozen=True)
class MtpLayerReport:
    """One MTP layer as found in a checkpoint."""

    index: int
    prefix: str
    present: tuple[str, ...]
    missing: tuple[str, ...]
    nbytes: int
    dtypes: tuple[str, ...]
    unreadable: tuple[str, ...] = ()
    """Present tensors whose bytes the files do not hold in full (a truncated shard)."""

    @property
    def complete(self) -> bool:
        """Every tensor the layer needs is there and readable."""
        return not self.missing and not self.unreadable


@dataclass(frozen=True)
class CheckpointSummary:
    """What mtpcheck learned about one input checkpoint."""

    path: str
    format: str
    family: str | None
    """Registry key of the MTP family, or None when unknown."""
    family_display: str
    model_type: str | None
    declared_mtp: int | None
    declared_by: str
    """Which config key declared the count, or why none did."""
    num_hidden_layers: int | None
    tensor_count: int
    total_bytes: int
    mtp_layers: tuple[MtpLayerReport, ...]


@dataclass(frozen=True)
class Estimate:
    """A measured share and its 95 % interval over sequences (``low`` and ``high`` are None
    when it cannot be estimated: fewer than two sequences, or no positions)."""

    value: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class AcceptanceResult:
    """Offline MTP acceptance of one checkpoint on one workload (``mtpcheck accept``).

    Teacher-forced, one draft token (k = 1): at each position t the MTP head's distribution q
    for token t+2 (from hidden state t and the embedding of token t+1) is scored against the
    main model's distribution p at t+1. Rates pool positions over sequences (ratio of sums);
    confidence intervals are 95 % over sequences (None with fewer than two sequences).
    """

    checkpoint: str
    workload: str
    drafter: bool
    """False when the checkpoint has no usable MTP layer ("no drafter": acceptance 0)."""
    note: str
    """Why there is no drafter; empty otherwise."""
    sequences: int
    positions: int
    greedy_hits: int
    greedy: Estimate
    """Fraction of positions where argmax q == argmax p."""
    alpha: Estimate
    """Mean over positions of sum_v min(p(v), q(v)) at ``temperature``."""
    tokens_per_pass: float
    """Expected tokens per target forward pass, 1 + alpha."""
    temperature: float
    chain: ChainAcceptance | None = None
    """Several MTP layers drafting in a chain (k = D): acceptance per depth."""


@dataclass(frozen=True)
class DepthAcceptance:
    """Depth d of a chain: the share of slots where drafts 1..d are all accepted."""

    depth: int
    greedy: Estimate
    alpha: Estimate
    """Mean over slots of the product of alpha at depths 1..d."""
    tokens_per_pass: float
    """Expected tokens per verify pass when drafting d tokens: 1 + alpha of depths 1..d."""


@dataclass(frozen=True)
class ChainAcceptance:
    """Teacher-forced acceptance of D chained MTP layers (k = D drafts per verify pass).

    At slot t depth j drafts token t+j+1 from depth j-1's state and token t+j; it is scored
    against the main model's distribution at t+j. Only slots where all D depths can be scored
    count (``positions``), so every depth is over the same slots.
    """

    hidden: str
    """What depth d passes to depth d+1: ``post-norm`` or ``pre-norm``."""
    positions: int
    depths: tuple[DepthAcceptance, ...]
    tokens_per_pass: Estimate
    """Expected tokens per verify pass with k = D: 1 + sum over depths of alpha."""
    greedy_tokens_per_pass: float
    """The same from greedy verdicts: 1 + the mean number of leading accepted drafts."""


@dataclass(frozen=True)
class OnlineAcceptance:
    """What a real draft-then-verify decoding run accepted (``accept --online``), and the
    teacher-forced figure at the very positions it drafted.

    Each sequence's first ``prompt_tokens`` tokens are the prompt; ``new_tokens`` or more are
    generated, k drafts (1, or the D chained MTP layers) verified per main-model pass.
    """

    checkpoint: str
    workload: str
    temperature: float
    sequences: int
    prompt_tokens: int
    new_tokens: int
    drafts: int
    """Verify passes (each with k drafts)."""
    accepted: int
    """Drafts at depth 1 accepted."""
    online: float
    """accepted / drafts: the depth-1 acceptance."""
    tokens_per_pass: float
    """Tokens emitted per verify pass: 1 + accepted drafts of all depths / passes."""
    teacher_forced: float
    """At the drafted positions: the greedy hit rate (T = 0) or mean alpha (T > 0), depth 1."""
    agreeing: int | None
    """T = 0: verify passes whose online verdict (the number of drafts accepted) equals the
    teacher-forced one (None when T > 0, where online verdicts are random draws)."""
    k: int = 1
    """Drafts per verify pass (the chained MTP depths)."""
    accepted_per_depth: tuple[int, ...] = ()
    """k > 1: passes whose drafts 1..d were all accepted, for d = 1..k."""
    teacher_forced_per_depth: tuple[float, ...] = ()
    """k > 1: the teacher-forced share for the same, at the drafted positions."""
    engine: str = "mtpcheck"
    """Whose decoding loop ran: ``mtpcheck`` or ``transformers`` (``generate(use_mtp=True)``,
    its counts as transformers reports them)."""
    in_output: int | None = None
    """transformers, T = 0: first drafts the generated text holds at their position (each one
    the main model's greedy token, so accepted in fact; transformers' count can be lower)."""
    draft_rule: str = "engine"
    """How the drafts were made: ``engine`` (vLLM's rule: deeper depths see only the slots
    they drafted at, layers reused, argmax drafts) or ``training`` (every depth over every
    slot, drafts sampled from q)."""

    @property
    def online_by_depth(self) -> tuple[float, ...]:
        """Per depth d: the share of passes whose drafts 1..d were accepted (k entries)."""
        if not self.accepted_per_depth:
            return (self.online,)
        return tuple(a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_depth)

    @property
    def teacher_forced_by_depth(self) -> tuple[float, ...]:
        """The teacher-forced share of the same (k entries)."""
        return self.teacher_forced_per_depth or (self.teacher_forced,)

    @property
    def engine_title(self) -> str:
        """Whose loop ran, in words."""
        if self.engine == "transformers":
            return "transformers generate(use_mtp=True)"
        if self.draft_rule == "engine":
            return "draft-then-verify, vLLM's draft rule"
        return "draft-then-verify, training rule"


@dataclass(frozen=True)
class EngineAcceptance:
    """What a serving engine's own MTP speculative decoding accepted (``accept --engine``),
    read from the engine's counters, on one workload.

    Per position i (1..k): the share of verify steps whose first i drafts were all accepted
    (vLLM's ``num_accepted_tokens_per_pos[i-1] / num_drafts``). Intervals are over requests.
    """

    checkpoint: str
    workload: str
    engine: str
    """The engine and its version, e.g. ``vLLM 0.32.0``."""
    k: int
    temperature: float
    requests: int
    prompt_tokens: int
    new_tokens: int
    generated_tokens: int
    drafts: int
    """Verify steps that carried drafts (vLLM: ``spec_decode_num_drafts``)."""
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    by_position: tuple[Estimate, ...]
    """Per position: steps whose first i drafts were accepted / steps, with its interval."""
    mean_acceptance_length: Estimate
    """1 + accepted tokens / steps: tokens emitted per target pass."""
    parallel: str = ""
    """How the engine was spread, e.g. ``tp=8 pp=2``."""
    teacher_forced: tuple[float, ...] = ()
    """``--teacher-forced``: per position, mtpcheck's teacher-forced share at the positions the
    engine drafted, on the engine's own output (empty when not asked)."""
    agreeing: int | None = None
    """Greedy with ``--teacher-forced``: steps whose accepted count equals the teacher-forced
    one."""

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens / draft tokens (vLLM's headline acceptance rate)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass(frozen=True)
class EngineDelta:
    """Engine acceptance of the compared checkpoint minus the reference's, one workload;
    paired over the same prompts, intervals over requests."""

    workload: str
    first_position: Estimate
    mean_acceptance_length: Estimate


@dataclass(frozen=True)
class AcceptanceDelta:
    """Acceptance of the compared checkpoint minus the reference's, on one workload.

    Paired over the same tokenised sequences; the 95 % intervals are over sequences.
    """

    workload: str
    greedy: Estimate
    alpha: Estimate
    tokens_per_pass: float


@dataclass(frozen=True)
class Report:
    """A finished run: inputs, checks, tensor comparisons. Renderers only read this."""

    command: str
    inputs: tuple[CheckpointSummary, ...]
    checks: tuple[CheckResult, ...]
    tensors: tuple[TensorComparison, ...] = ()
    acceptance: tuple[AcceptanceResult, ...] = ()
    """``accept`` only: one entry per (checkpoint, workload), reference checkpoint first."""
    acceptance_deltas: tuple[AcceptanceDelta, ...] = ()
    """``accept --compare`` only: compared minus reference, one entry per workload."""
    online: tuple[OnlineAcceptance, ...] = ()
    """``accept --online`` only: one entry per (checkpoint, workload) with a drafter."""
    engine: tuple[EngineAcceptance, ...] = ()
    """``accept --engine`` only: one entry per (checkpoint, workload) the engine ran."""
    engine_deltas: tuple[EngineDelta, ...] = ()
    """``accept --engine --compare`` only: compared minus reference, one entry per workload."""

    @property
    def ok(self) -> bool:
        return all(c.status is not Status.FAIL for c in self.checks)
