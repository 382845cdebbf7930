"""What one ``mtpcheck accept`` run is asked to do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mtpcheck.accept.vllm_engine import VllmSettings
from mtpcheck.model.modes import DraftRule, OnlineEngine


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


@dataclass(frozen=True)
class AcceptOptions:
    """Everything one ``accept`` run measures and how; built by :func:`mtpcheck.api.accept`."""

    checkpoint: Path | None
    """None only with ``server`` (``accept --server`` without CKPT)."""
    workloads: tuple[tuple[str, Path], ...]
    compare: Path | None = None
    temperature: float = 1.0
    device: str = "cpu"
    """Where the MTP layers run (and the main model, without ``device_map``)."""
    device_map: str | None = None
    """accelerate's placement of the main model: a strategy name or a JSON map file."""
    dtype: str = "auto"
    max_tokens: int = 512
    tokenizer: Path | None = None
    min_acceptance: float | None = None
    trust_pickle: bool = False
    online: bool = False
    """Also run real draft-then-verify decoding (``accept --online``)."""
    prompt_tokens: int = 9
    new_tokens: int = 40
    online_engine: OnlineEngine = OnlineEngine.MTPCHECK
    """``mtpcheck`` (this package's loop) or ``transformers`` (``generate(use_mtp=True)``)."""
    depths: int | None = None
    """Chain at most this many MTP layers (k); all the checkpoint holds by default."""
    draft_rule: DraftRule = DraftRule.ENGINE
    """How --online drafts: ``engine`` (vLLM's rule: :mod:`mtpcheck.accept.engine_rule`) or
    ``training`` (every depth over every slot, drafts sampled from q, as megatron-core
    trains: :func:`mtpcheck.accept.online.speculative_decode`)."""
    chain: str | None = None
    """Override the family's rule for what depth d passes to depth d+1 (a
    :class:`ChainHidden` value: ``post-norm`` or ``pre-norm``)."""
    engine: str | None = None
    """``vllm``: measure through the serving engine's own speculative decoding instead of
    mtpcheck's teacher-forced pass (:mod:`mtpcheck.accept.engine_runner`)."""
    vllm: VllmSettings = VllmSettings()
    teacher_forced: bool = False
    """``--engine``: also score the engine's output teacher-forced at the positions it drafted."""
    server: ServerOptions | None = None
    """``--server``: measure on a running server (:mod:`mtpcheck.accept.server_runner`)."""
    drafter: Path | None = None
    """``--engine vllm --drafter DIR``: vLLM drafts with this separate drafter (EAGLE-3,
    DFlash, ...) instead of the checkpoint's MTP layers."""
