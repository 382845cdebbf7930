"""What one ``mtpcheck accept`` run is asked to do: every option declared once, here.

The CLI's parameters are generated from :class:`AcceptOptions`' fields and
:func:`mtpcheck.api.accept` takes the same fields as keywords; :meth:`AcceptOptions.validate`
holds the rules between them, so the API refuses exactly what the CLI refuses.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpcheck.accept.server_engines import ENGINES
from mtpcheck.declared import (
    UsageError,
    argument,
    bad_value,
    check_fields,
    flag,
    given,
    internal,
    option,
    required_option,
    silent,
)
from mtpcheck.dtypes import COMPUTE_DTYPE_CHOICES
from mtpcheck.model.modes import ChainHidden, DraftRule, OnlineEngine
from mtpcheck.settings import VLLM_VENV


@dataclass(frozen=True)
class VllmSettings:
    """How the engine is started, beyond the checkpoint and the prompts."""

    python: str = sys.executable
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    executor: str | None = None
    """vLLM's ``distributed_executor_backend`` (``mp`` or ``ray``; vLLM's default if None)."""
    dtype: str = "auto"
    extra: tuple[tuple[str, Any], ...] = ()
    """Further ``vllm.LLM`` keyword arguments (``--vllm-arg KEY=VALUE``)."""
    log: Path | None = None
    """Where vLLM's own log goes (``--engine-log``); discarded if None."""

    @property
    def parallel(self) -> str:
        """How vLLM is spread, e.g. ``tp=8 pp=2``."""
        return f"tp={self.tensor_parallel_size} pp={self.pipeline_parallel_size}"


def parse_vllm_arg(spec: str) -> tuple[str, Any]:
    """``KEY=VALUE``; VALUE is read as JSON where it parses (``67108864``, ``true``,
    ``{"a": 1}``), else kept as a string."""
    key, sep, value = spec.partition("=")
    if not sep or not key.isidentifier():
        raise ValueError(f"{spec!r}: expected KEY=VALUE with KEY a vllm.LLM argument name")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


_WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
"""A workload's name: it names a row of the report and a key of a saved profile."""


def parse_spec(spec: str) -> tuple[str, Path]:
    """``NAME=PATH`` -> (name, path); raises ValueError with a readable reason."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"{spec!r} is not NAME=PATH")
    if not _WORKLOAD_NAME.match(name):
        raise ValueError(f"workload name {name!r} may use only letters, digits, '_', '.', '-'")
    return name, Path(path)


@dataclass(frozen=True)
class ServerOptions:
    """Where the server is and how to talk to it (the rest is :class:`AcceptOptions`)."""

    url: str
    engine: str | None = None
    """``--server-engine``: skip detection."""
    model: str | None = None
    """``--server-model``: the model name to ask for (default: the one the server lists)."""
    timeout: float = 600.0
    concurrency: int | None = None
    """Requests in flight at once; None: the engine's default (:mod:`server_requests`)."""
    save_profile: Path | None = None
    profile: Path | None = None
    drafter: Path | None = None
    """``--drafter``: the separate drafter the server drafts with, as the user says (a server
    does not tell it); its kind and vLLM method are named in the report."""


_ENGINE_ONLY = (
    "vllm_python", "tensor_parallel_size", "pipeline_parallel_size",
    "distributed_executor_backend", "vllm_args", "engine_log", "teacher_forced",
)  # fmt: skip
"""``--engine vllm``'s own options."""
_CLASHING_WITH_ENGINE = ("online", "device_map", "chain", "online_engine", "draft_rule", "seed")
"""What mtpcheck's own decoding takes and the engine replaces."""
_SERVER_ONLY = (
    "server_engine", "server_model", "concurrency", "request_timeout", "save_profile", "profile",
)  # fmt: skip
"""Options of the running-server path only."""
_NOT_ON_SERVER = (
    "compare", "device_map", "plot", "online", "online_engine", "depths", "draft_rule", "chain",
    "seed", "engine", *_ENGINE_ONLY,
)  # fmt: skip
"""Options of the other paths that mean nothing on a running server."""


@dataclass(frozen=True)
class AcceptOptions:
    """Everything one ``accept`` run measures and how."""

    checkpoint: Path | None = argument(
        "The checkpoint whose MTP layers are measured (None only with --server).",
        path="any",
        metavar="CKPT",
        required=False,
    )
    workloads: tuple[tuple[str, Path], ...] = required_option(
        "A workload: JSONL with 'text' or 'messages', or plain text (repeatable).",
        flag="--workload",
        metavar="NAME=PATH",
        repeatable=True,
        parse=parse_spec,
        positional=True,
    )
    compare: Path | None = option(
        None,
        "Also measure this checkpoint on the same token sequences and report B - A.",
        path="any",
    )
    temperature: float = option(
        1.0,
        "Temperature of p and q for alpha; 0 makes alpha the greedy acceptance.",
        float,
        minimum=0,
    )
    device: str = option(
        "cpu",
        "Where the MTP layers run, and the main model unless --device-map places it.",
        choices=("cpu", "cuda"),
    )
    device_map: str | None = option(
        None,
        "Spread the main model over every visible GPU and the CPU with accelerate (a "
        "strategy name, or a JSON map of module name -> 'cpu' / 'disk' / GPU index), for models "
        "that fit one node but not one device.",
        metavar="auto|balanced|sequential|FILE.json",
    )
    dtype: str = option(
        "auto",
        "Compute dtype; auto: float32 on CPU, the checkpoint's dtype on CUDA.",
        choices=COMPUTE_DTYPE_CHOICES,
    )
    max_tokens: int = option(512, "Cut each sequence to this many tokens.", int, minimum=2)
    tokenizer: Path | None = option(
        None,
        "Tokenizer folder (default: CKPT's); both checkpoints see the same token ids.",
        path="dir",
    )
    min_acceptance: float | None = option(
        None,
        "CI gate: exit 1 if alpha on any workload (of any checkpoint) is below this.",
        float,
        minimum=0,
        maximum=1,
    )
    plot: Path | None = option(
        None,
        "Also write a PNG bar chart of acceptance per workload (and checkpoint).",
        path="file",
        output=True,
    )
    online: bool = option(
        False,
        "Also run real draft-then-verify decoding from each sequence's first tokens and "
        "report what it accepts beside the teacher-forced figure at the same positions.",
        bool,
    )
    prompt_tokens: int = option(
        9, "--online: prompt length in tokens (the rest of each sequence is not used).", int,
        minimum=2,
    )  # fmt: skip
    new_tokens: int = option(40, "--online: tokens to generate after each prompt.", int, minimum=1)
    seed: int = option(
        0,
        "--online: the seed of its sampling at --temperature above 0; another seed shows how "
        "far the online figure moves by chance.",
        int,
        minimum=0,
    )
    online_engine: OnlineEngine = option(
        OnlineEngine.MTPCHECK,
        "--online: mtpcheck's own draft-then-verify loop, or transformers' "
        "generate(use_mtp=True) with the counts transformers reports (docs/acceptance/online.md).",
        choices=OnlineEngine,
    )
    depths: int | None = option(
        None,
        "Chain at most this many MTP layers (the drafts per verify pass, k); default: all "
        "the checkpoint holds.",
        int,
        minimum=1,
    )
    draft_rule: DraftRule = option(
        DraftRule.ENGINE,
        "--online: how the drafts are made. engine: as vLLM drafts (depth 1 fed "
        "the state the engine feeds, through the main embedding and head; deeper depths see only "
        "the slots they drafted at; one layer reused for more drafts than layers; drafts are "
        "argmax, rejection-sampled at T > 0). training: every depth over every slot, through the "
        "stored copies, drafts sampled from q, as megatron-core trains and the teacher-forced "
        "figures score.",
        choices=DraftRule,
    )
    chain: str | None = option(
        None,
        "What MTP depth d passes to depth d+1: its output after the layer's final norm or "
        "before it. Default: the rule of the engine that serves the family "
        "(docs/acceptance/depths.md).",
        choices=tuple(c.value for c in ChainHidden),
    )
    engine: str | None = option(
        None,
        "Measure with the serving engine's own MTP speculative decoding (each sequence's "
        "first --prompt-tokens ids as the prompt, --new-tokens generated, --depths drafts a step; "
        "default k: the MTP layers CKPT holds) and report its counters per workload, instead of "
        "the teacher-forced pass.",
        choices=("vllm",),
    )
    vllm_python: str | None = option(
        None,
        "--engine vllm: the interpreter that has vLLM >= 0.32 (default: "
        "$MTPCHECK_VLLM_VENV/bin/python where that variable names a venv, else this one; "
        "`pip install mtpcheck[vllm]`).",
        metavar="PYTHON",
    )
    tensor_parallel_size: int = option(1, "--engine vllm: GPUs per pipeline stage.", int, minimum=1)
    pipeline_parallel_size: int = option(
        1,
        "--engine vllm: pipeline stages (across nodes with --distributed-executor-backend ray).",
        int,
        minimum=1,
    )
    distributed_executor_backend: str | None = option(
        None,
        "--engine vllm: vLLM's executor (default: vLLM's choice; ray for several nodes).",
        choices=("mp", "ray"),
    )
    vllm_args: tuple[str, ...] = option(
        (),
        "--engine vllm: a further vllm.LLM argument, VALUE as JSON where it parses "
        "(repeatable), e.g. max_model_len=4096, gpu_memory_utilization=0.85.",
        flag="--vllm-arg",
        metavar="KEY=VALUE",
        repeatable=True,
    )
    engine_log: Path | None = option(
        None,
        "--engine vllm: write vLLM's own log here (default: discarded).",
        path="file",
        output=True,
    )
    teacher_forced: bool = option(
        False,
        "--engine vllm: also load CKPT with transformers and score the engine's output "
        "teacher-forced at the positions the engine drafted, beside its figure.",
        bool,
    )
    server_url: str | None = option(
        None,
        "Measure on a running OpenAI-compatible server (vLLM, SGLang, llama.cpp) by the "
        "engine's own figures for exactly these requests; CKPT, if given, says what its drafter "
        "should accept there (docs/acceptance/server.md).",
        flag="--server",
        metavar="URL",
    )
    server_engine: str | None = option(
        None,
        "--server: the engine behind URL (default: told by its /metrics names).",
        choices=tuple(ENGINES),
    )
    server_model: str | None = option(
        None,
        "--server: the model name to ask for (default: the one the server lists).",
        metavar="NAME",
    )
    concurrency: int | None = option(
        None,
        "--server: requests in flight at once (default: 32 where the engine returns "
        "per-request figures; else 1, each request between two reads of its counters).",
        int,
        minimum=1,
    )
    request_timeout: float = option(
        600.0, "--server: seconds one request may take.", float, minimum=0, above=True
    )
    save_profile: Path | None = option(
        None,
        "--server: write the figures per workload and position here, to hold later runs to.",
        path="file",
        output=True,
    )
    profile: Path | None = option(
        None,
        "--server: fail a workload whose acceptance at a position falls below this saved "
        "profile's by more than both runs' spread allows.",
        path="file",
    )
    drafter: Path | None = option(
        None,
        "A separate drafter (EAGLE-3, DFlash, ...) instead of CKPT's MTP layers. With "
        "--engine vllm: vLLM drafts with it (method from its kind, e.g. eagle3; default k: "
        "its config's speculative_tokens). With --server: the drafter the server drafts with, "
        "named with its method in the report (a server does not tell it); give the target as "
        "--tokenizer, not CKPT.",
        path="dir",
        metavar="DIR",
    )
    trust_pickle: bool = internal(False)
    """Unpickle Megatron files without the allowlist (the CLI's ``--trust-pickle``)."""
    log: Callable[[str], None] = internal(silent)
    """Where progress lines go (the CLI: stderr); dropped by default."""

    def __post_init__(self) -> None:
        """The workloads as (name, Path) pairs, also when given as a mapping or with str
        paths, and the checkpoint as a Path."""
        pairs = self.workloads.items() if isinstance(self.workloads, Mapping) else self.workloads
        workloads = tuple((str(name), Path(file)) for name, file in pairs)
        object.__setattr__(self, "workloads", workloads)
        if self.checkpoint is not None:
            object.__setattr__(self, "checkpoint", Path(self.checkpoint))

    def validate(self) -> None:
        """Refuse options that do not go together (:class:`UsageError`, the CLI's exit 2)."""
        check_fields(self)
        names = [name for name, _ in self.workloads]
        if len(set(names)) != len(names):
            raise bad_value("--workload", "workload names must be unique")
        if self.server_url is not None:
            self._validate_server()
            return
        self._first_given(_SERVER_ONLY, "{} needs --server")
        if self.drafter is not None and self.engine is None:
            raise UsageError("--drafter needs --server or --engine vllm")
        if self.checkpoint is None:
            raise UsageError("Missing argument 'CKPT' (only --server runs without one).")
        self._validate_engine()
        if self.seed != 0 and not self.online:
            raise UsageError("--seed needs --online")

    def _validate_server(self) -> None:
        """``--server``: nothing of the offline paths."""
        self._first_given(_NOT_ON_SERVER, "{} does not apply to --server")
        if self.drafter is not None and self.checkpoint is not None:
            raise UsageError(
                "--drafter with CKPT: the offline expectation is computed for a checkpoint's own "
                "MTP layers only; give the target as --tokenizer instead"
            )

    def _validate_engine(self) -> None:
        """``--engine vllm``'s options only with it, and what it replaces not with it."""
        try:
            self._vllm_extra()
        except ValueError as e:
            raise bad_value("--vllm-arg", str(e)) from e
        if self.engine is None:
            self._first_given(_ENGINE_ONLY, "{} needs --engine vllm")
            return
        self._first_given(_CLASHING_WITH_ENGINE, f"{{}} does not apply to --engine {self.engine}")
        if self.drafter is not None:
            self._first_given(
                ("teacher_forced", "compare"),
                "{} does not apply to --drafter: mtpcheck scores and compares a checkpoint's "
                "own MTP layers only",
            )

    def _first_given(self, names: tuple[str, ...], message: str) -> None:
        """A usage error naming the first of ``names`` set to other than its default."""
        flags = {flag(self, name) for name in names}
        for name in given(self):
            if name in flags:
                raise UsageError(message.format(name))

    @property
    def vllm(self) -> VllmSettings:
        """How vLLM is started (``--engine vllm``)."""
        return VllmSettings(
            python=self.vllm_python or _venv_python() or sys.executable,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            executor=self.distributed_executor_backend,
            dtype=self.dtype,
            extra=self._vllm_extra(),
            log=self.engine_log,
        )

    def _vllm_extra(self) -> tuple[tuple[str, Any], ...]:
        """``--vllm-arg``'s keywords (ValueError for one that is not KEY=VALUE)."""
        return tuple(parse_vllm_arg(spec) for spec in self.vllm_args)

    @property
    def server(self) -> ServerOptions | None:
        """The running server to measure on (``--server``), or None."""
        if self.server_url is None:
            return None
        return ServerOptions(
            url=self.server_url,
            engine=self.server_engine,
            model=self.server_model,
            timeout=self.request_timeout,
            concurrency=self.concurrency,
            save_profile=self.save_profile,
            profile=self.profile,
            drafter=self.drafter,
        )


def _venv_python() -> str | None:
    """The interpreter of the venv ``MTPCHECK_VLLM_VENV`` names (vLLM's pins often need a
    venv of their own), or None."""
    venv = VLLM_VENV.value()
    return str(venv / "bin" / "python") if venv is not None else None
