"""A torch_dist checkpoint's config: the saved ``args`` (``common.pt``, or the common state
megatron-core >= 0.19 stores inside the data files) and Megatron-Bridge's ``run_config.yaml``,
read as mtpcheck's canonical Megatron config."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError, shown
from mtpcheck.formats.chunked_read import TEXT_FILE_BYTES, open_regular, read_text_capped
from mtpcheck.formats.megatron_common import (
    MODEL_TYPE,
    RUN_CONFIG_FILE,
    args_config,
    config_from_mapping,
    inside,
)
from mtpcheck.model import IntegrityIssue

COMMON_STATE_KEY = "common_state/"
"""megatron-core >= 0.19 saves the common state (``args``, ``iteration``, ...) as this bytes
item of the checkpoint itself instead of ``common.pt``."""
MAX_COMMON_BYTES = 64 * 2**20


def _embedded_common_state(
    directory: Path, metadata: Any, trust_pickle: bool
) -> tuple[Any, str] | None:
    """The common state stored inside the data files, and where, if the save has one."""
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        return None
    for index, info in storage.items():
        fqn = getattr(index, "fqn", None)
        if not isinstance(fqn, str) or not fqn.startswith(COMMON_STATE_KEY):
            continue
        relative = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        where = f"{directory / '.metadata'} ({fqn})"
        if not inside(relative) or "/" in relative or "\\" in relative:
            raise InputError(
                where, f"points to {shown(relative)}, outside the checkpoint directory"
            )
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0):
            raise InputError(where, "has no valid byte range")
        if not 0 < length <= MAX_COMMON_BYTES:
            raise InputError(where, f"is {length} bytes; at most {MAX_COMMON_BYTES} are read")
        fd = open_regular(directory / relative)  # a FIFO would block open()
        try:
            blob = os.pread(fd, length, offset)
        except OSError as e:
            raise InputError(directory / relative, e.strerror or str(e)) from e
        finally:
            os.close(fd)
        if len(blob) != length:
            raise InputError(directory / relative, f"truncated: {fqn} lies past its end")
        from mtpcheck.formats.safe_pickle import load_torch_file

        content = load_torch_file(where, trust_pickle=trust_pickle, blob=blob)
        # megatron-core saves the ShardedObject's data as a one-element list
        if isinstance(content, list) and len(content) == 1:
            content = content[0]
        return content, where
    return None


def load_config(
    directory: Path, metadata: Any, trust_pickle: bool
) -> tuple[dict[str, Any], str | None, list[IntegrityIssue]]:
    """The model config of a torch_dist checkpoint (``common.pt``, or its state inside the
    data files, then ``run_config.yaml``), the file it came from and what could not be read."""
    config: dict[str, Any] = {}
    config_path: str | None = None
    issues: list[IntegrityIssue] = []
    common = directory / "common.pt"
    embedded = (
        None if common.is_file() else _embedded_common_state(directory, metadata, trust_pickle)
    )
    if common.is_file():
        from mtpcheck.formats.safe_pickle import load_torch_file

        content = load_torch_file(common, trust_pickle=trust_pickle)
        args = content.get("args") if isinstance(content, dict) else None
        config.update(args_config(args))
        config_path = str(common)
    elif embedded is not None:
        content, config_path = embedded
        args = content.get("args") if isinstance(content, dict) else None
        config.update(args_config(args))
    else:
        issues.append(
            IntegrityIssue("missing-file", "common.pt", "common.pt is missing (no saved args)")
        )
    run_config = directory / RUN_CONFIG_FILE
    if run_config.is_file():
        section = _yaml_model_section(run_config)
        if section is None:
            issues.append(
                IntegrityIssue(
                    "config-unread", RUN_CONFIG_FILE, "PyYAML is not installed; not read"
                )
            )
        else:
            config.update(config_from_mapping(section))
            config_path = str(run_config)
    config["model_type"] = MODEL_TYPE
    return config, config_path, issues


def _yaml_model_section(path: Path) -> Mapping[str, Any] | None:
    """The ``model:`` mapping of a Megatron-Bridge run config; None when PyYAML is missing."""
    try:
        import yaml
    except ImportError:
        return None

    class _Loader(yaml.SafeLoader):
        """Safe loader that reads python-tagged nodes as plain data instead of objects."""

    def plain(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)  # type: ignore[arg-type]

    _Loader.add_multi_constructor("", plain)
    text = read_text_capped(path, TEXT_FILE_BYTES)
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except (yaml.YAMLError, RecursionError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(path, f"invalid YAML ({reason})") from e
    model = raw.get("model") if isinstance(raw, dict) else None
    if not isinstance(model, dict):
        raise InputError(path, "run config has no 'model:' section")
    return model
