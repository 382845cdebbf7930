"""Megatron torch_dist and legacy readers against real megatron-core checkpoints.

The checkpoints are written once per session by ``tests/megatron_fixtures.py`` in subprocesses
(one gloo process for the single-rank saves, two for the TP=2 / PP=2 / EP=2 saves).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mtpcheck import CheckName
from mtpcheck.dtypes import safetensors_code
from mtpcheck.errors import InputError
from mtpcheck.formats import READERS, open_checkpoint
from mtpcheck.formats.megatron_common import canonical_name
from mtpcheck.formats.megatron_dist import MegatronDistReader
from mtpcheck.formats.megatron_legacy import MegatronLegacyReader
from mtpcheck.formats.safe_pickle import Placeholder, load_raw_pickle, load_torch_file
from mtpcheck.model import Checkpoint
from tests.torch_saved import load_torch
from tests.without_extras import run_core, stderr_lines

BUILDER = Path(__file__).with_name("megatron_fixtures.py")
REPO = Path(__file__).resolve().parent.parent


class _Builds:
    """Both builder subprocesses, started together so they overlap on the CPU cores."""

    def __init__(self, root: Path) -> None:
        self.out = {kind: root / kind for kind in ("single", "parallel")}
        self.logs = {kind: root / f"{kind}.log" for kind in self.out}
        self.procs = {}
        for kind, out in self.out.items():
            with open(self.logs[kind], "w") as log:
                self.procs[kind] = subprocess.Popen(
                    [sys.executable, "-W", "ignore", str(BUILDER), kind, str(out)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

    def wait(self, kind: str) -> Path:
        if self.procs[kind].wait(timeout=300):
            log = self.logs[kind].read_text()[-4000:]
            pytest.fail(f"building {kind} checkpoints failed:\n{log}")
        return self.out[kind]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def _builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Builds]:
    builds = _Builds(tmp_path_factory.mktemp("megatron"))
    yield builds
    builds.stop()


@pytest.fixture(scope="session")
def single(_builds: _Builds) -> Path:
    return _builds.wait("single")


@pytest.fixture(scope="session")
def parallel(_builds: _Builds) -> Path:
    return _builds.wait("parallel")


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _read(ckpt: Checkpoint, name: str, chunk_bytes: int = 1 << 20) -> bytes:
    pieces = list(ckpt.read_chunks(name, chunk_bytes))
    assert all(len(p) <= chunk_bytes for p in pieces)
    return b"".join(pieces)


def _reference(single: Path, kind: str) -> dict[str, torch.Tensor]:
    state = torch.load(single / f"{kind}_ref.pt", weights_only=True)
    return {k: v for k, v in state.items() if "_extra_state" not in k}


def _assert_matches(ckpt: Checkpoint, reference: dict[str, torch.Tensor]) -> None:
    assert sorted(ckpt.tensors) == sorted(reference)
    for name, tensor in reference.items():
        meta = ckpt.tensors[name]
        assert (meta.shape, meta.dtype) == (tuple(tensor.shape), safetensors_code(tensor.dtype))
        assert meta.nbytes == tensor.numel() * tensor.element_size() and meta.readable
        assert _read(ckpt, name, chunk_bytes=40) == _raw(tensor), name


# --- torch_dist -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "on_disk"),
    [
        ("dense", "decoder.layers.self_attention.linear_qkv.weight"),
        ("moe", "decoder.layers.1.mlp.experts.experts.linear_fc1.weight"),
        ("moe_singleton", "decoder.layers.1.mlp.experts.experts.3.linear_fc1.weight_v"),
    ],
)
def test_torch_dist_matches_model_state_dict(single: Path, kind: str, on_disk: str) -> None:
    iteration = next((single / kind).glob("iter_*"))
    stored = load_raw_pickle(iteration / ".metadata").state_dict_metadata
    assert on_disk in stored  # the stacked / expert-axis / split-GLU layout really is on disk
    ckpt = open_checkpoint(iteration)
    assert ckpt.format == "megatron-torch-dist" and ckpt.issues == ()
    _assert_matches(ckpt, _reference(single, kind.removesuffix("_singleton")))
    assert ckpt.config["mtp_num_layers"] == 1 and ckpt.config["num_layers"] == 2
    assert ckpt.config["model_type"] == "megatron"
    assert ckpt.config_path == str(iteration / "common.pt")


def test_megatron_lm_default_save_strategy_is_read(single: Path) -> None:
    """Saved as Megatron-LM's ``save_checkpoint`` saves (megatron-core's default torch_dist
    strategy, fully parallel): ``.metadata`` keeps every rank's save plan (megatron-core sets
    ``all_local_plans`` on it) and the data is spread over two writer files. Same model, same
    bytes as the plain save."""
    iteration = single / "dense_mlm" / "iter_0000005"
    metadata = load_raw_pickle(iteration / ".metadata")
    (plan,) = metadata.all_local_plans
    assert type(plan).__name__ == "SavePlan" and len(plan.items) > 20
    assert sorted(p.name for p in iteration.glob("*.distcp")) == ["__0_0.distcp", "__0_1.distcp"]
    ckpt = open_checkpoint(single / "dense_mlm")
    assert ckpt.format == "megatron-torch-dist" and ckpt.issues == ()
    _assert_matches(ckpt, _reference(single, "dense"))
    assert ckpt.config["mtp_num_layers"] == 1


@pytest.mark.parametrize(
    ("stored", "canonical"),
    [
        (
            "mtp.layers.2.mtp_model_layer.mlp.router.weight",
            "mtp.layers.2.transformer_layer.mlp.router.weight",
        ),
        (
            "mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.layer_norm_weight",
            "mtp.layers.0.transformer_layer.input_layernorm.weight",
        ),
        (
            "decoder.layers.3.mlp.linear_fc1.layer_norm_bias",
            "decoder.layers.3.pre_mlp_layernorm.bias",
        ),
        ("decoder.layers.3.pre_mlp_layernorm.weight", "decoder.layers.3.pre_mlp_layernorm.weight"),
        (
            "decoder.layers.3.mlp.shared_experts.linear_fc1.weight",
            "decoder.layers.3.mlp.shared_experts.linear_fc1.weight",
        ),
        # Transformer Engine MLA: the norms fused into the up projections (Megatron-Bridge 0.6)
        (
            "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight",
            "decoder.layers.0.self_attention.q_layernorm.weight",
        ),
        (
            "mtp.layers.0.mtp_model_layer.self_attention.linear_kv_up_proj.layer_norm_weight",
            "mtp.layers.0.transformer_layer.self_attention.kv_layernorm.weight",
        ),
    ],
)
def test_canonical_spelling(stored: str, canonical: str) -> None:
    assert canonical_name(stored) == canonical


def test_moe_names_are_local_spec_names(single: Path) -> None:
    names = set(open_checkpoint(single / "moe").tensors)
    mtp = "mtp.layers.0.transformer_layer."
    for prefix in ("decoder.layers.1.", mtp):
        assert f"{prefix}input_layernorm.weight" in names
        assert f"{prefix}pre_mlp_layernorm.weight" in names
        assert f"{prefix}mlp.router.expert_bias" in names
        assert f"{prefix}mlp.shared_experts.linear_fc1.weight" in names
        assert {
            f"{prefix}mlp.experts.local_experts.{e}.linear_fc2.weight" for e in range(4)
        } <= names
    assert not any("layer_norm_weight" in n or "experts.experts" in n for n in names)


def test_entry_points_and_release(single: Path, tmp_path: Path) -> None:
    iteration = single / "dense" / "iter_0000005"
    release_root = tmp_path / "release_root"
    shutil.copytree(iteration, release_root / "release")
    (release_root / "latest_checkpointed_iteration.txt").write_text("release\n")
    expected = open_checkpoint(single / "dense").tensors
    for path in (iteration, iteration / "metadata.json", release_root):
        ckpt = open_checkpoint(path)
        assert ckpt.format == "megatron-torch-dist" and ckpt.tensors.keys() == expected.keys()
    name = "mtp.layers.0.eh_proj.weight"
    assert _read(open_checkpoint(release_root), name) == _read(open_checkpoint(iteration), name)


def test_tracker_problems(single: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(single / "dense" / "iter_0000005", root / "iter_0000005")
    with pytest.raises(InputError, match="no latest_checkpointed_iteration.txt.*iter_0000005"):
        open_checkpoint(root)
    (root / "latest_checkpointed_iteration.txt").write_text("12")
    with pytest.raises(InputError, match="iter_0000012/ does not exist"):
        open_checkpoint(root)
    (root / "latest_checkpointed_iteration.txt").write_text("latest")
    with pytest.raises(InputError, match="expected an iteration number or 'release'"):
        open_checkpoint(root)


def test_run_config_yaml_declares_mtp(single: Path) -> None:
    iteration = single / "bridge" / "iter_0000007"
    assert load_torch_file(iteration / "common.pt") == {}  # no args: only the YAML declares
    ckpt = open_checkpoint(iteration)
    assert ckpt.config["mtp_num_layers"] == 1 and ckpt.config["num_layers"] == 2
    assert ckpt.config["params_dtype"] == {"_target_": "torch.bfloat16", "_call_": False}
    assert ckpt.config_path == str(iteration / "run_config.yaml")
    _assert_matches(ckpt, _reference(single, "dense"))


def _copy(single: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(single / "dense" / "iter_0000005", tmp_path / "iter_0000005"))


def test_half_written_checkpoint(single: Path, tmp_path: Path) -> None:
    iteration = _copy(single, tmp_path)
    (iteration / "metadata.json").unlink()
    with pytest.raises(InputError) as e:
        open_checkpoint(iteration)
    assert "half-written torch_dist checkpoint" in str(e.value)
    assert "metadata.json is written last" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("remove", "message"),
    [(".metadata", r"\.metadata: missing"), ("__0_0.distcp", r"__0_0\.distcp: named in .metadata")],
)
def test_missing_files(single: Path, tmp_path: Path, remove: str, message: str) -> None:
    iteration = _copy(single, tmp_path)
    (iteration / remove).unlink()
    with pytest.raises(InputError, match=message):
        open_checkpoint(iteration)


def test_truncated_distcp_marks_tensors_unreadable(single: Path, tmp_path: Path) -> None:
    iteration = _copy(single, tmp_path)
    data = iteration / "__0_0.distcp"
    os.truncate(data, data.stat().st_size - 1)
    ckpt = open_checkpoint(iteration)
    issues = [i for i in ckpt.issues if i.kind == "chunk-out-of-range"]
    assert [i.subject for i in issues] == ["__0_0.distcp"]
    cut = [n for n, m in ckpt.tensors.items() if not m.readable]
    assert cut and cut[0] in issues[0].message
    with pytest.raises(InputError, match="past the end"):
        _read(ckpt, cut[0])
    reference = _reference(single, "dense")
    for name in set(ckpt.tensors) - set(cut):
        assert _read(ckpt, name) == _raw(reference[name])


def test_old_metadata_with_megatron_classes(
    single: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Older cores pickle ``MCoreMetadata``; it loads as an inert placeholder."""
    iteration = _copy(single, tmp_path)
    module = types.ModuleType("megatron_old_core")
    cls = type("MCoreMetadata", (), {"__module__": "megatron_old_core"})
    module.MCoreMetadata = cls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron_old_core", module)
    old = cls()
    # the file is one this test session wrote: a plain unpickle (real torch classes) is safe
    old.__dict__.update(vars(pickle.loads((iteration / ".metadata").read_bytes())))
    (iteration / ".metadata").write_bytes(pickle.dumps(old))
    monkeypatch.delitem(sys.modules, "megatron_old_core")
    _assert_matches(open_checkpoint(iteration), _reference(single, "dense"))


# --- legacy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("run", ["tp2", "pp2", "ep2"])
def test_legacy_equals_torch_dist_of_same_model(parallel: Path, run: str) -> None:
    legacy = open_checkpoint(parallel / f"legacy_{run}")
    dist = open_checkpoint(parallel / f"dist_{run}")
    assert (legacy.format, dist.format) == ("megatron-legacy", "megatron-torch-dist")
    assert sorted(legacy.tensors) == sorted(dist.tensors)
    for name, meta in dist.tensors.items():
        assert (legacy.tensors[name].shape, legacy.tensors[name].dtype) == (meta.shape, meta.dtype)
        assert _read(legacy, name, 48) == _read(dist, name), name
    assert legacy.config["mtp_num_layers"] == 1
    assert legacy.tensors["embedding.word_embeddings.weight"].shape == (100, 32)  # padding gone


def test_legacy_tp2_joins_gated_fc1_per_half(parallel: Path) -> None:
    iteration = parallel / "legacy_tp2" / "iter_0000004"
    files = [load_torch(iteration / f"mp_rank_0{r}" / "model_optim_rng.pt") for r in range(2)]
    args = files[0]["args"]
    assert args.exit_signal == signal.SIGTERM
    if "megatron.core" not in sys.modules:  # importing megatron allowlists its classes in torch
        assert isinstance(args.attention_backend, Placeholder)  # a megatron enum
        assert isinstance(files[0]["rng_state"][0]["np_rng_state"][1], Placeholder)  # numpy
    shards = [f["model"] for f in files]
    name = "mtp.layers.0.transformer_layer.mlp.linear_fc1.weight"
    ckpt = open_checkpoint(iteration)
    gate = torch.cat([s[name][:32] for s in shards])
    up = torch.cat([s[name][32:] for s in shards])
    assert _read(ckpt, name) == _raw(torch.cat([gate, up]))
    assert _read(ckpt, name) != _raw(torch.cat([s[name] for s in shards]))


def test_legacy_layouts(parallel: Path) -> None:
    pp = open_checkpoint(parallel / "legacy_pp2" / "iter_0000004" / "mp_rank_00_001")
    assert {n.split(".")[2] for n in pp.tensors if n.startswith("decoder.layers.")} == {
        "0",
        "1",
        "2",
        "3",
    }
    ep = open_checkpoint(parallel / "legacy_ep2")
    for prefix in ("decoder.layers.1.", "mtp.layers.0.transformer_layer."):
        experts = {n for n in ep.tensors if n.startswith(f"{prefix}mlp.experts.local_experts.")}
        assert {n.split("local_experts.")[1].split(".")[0] for n in experts} == {"0", "1", "2", "3"}


def _resave(rank_file: Path, drop: tuple[str, ...] = ()) -> dict:
    """Load a rank file safely and return it in a form ``torch.save`` can write again."""
    content = load_torch(rank_file)
    args = vars(content["args"]).items()
    plain = {k: v for k, v in args if not isinstance(v, Placeholder) and k not in drop}
    content["args"] = argparse.Namespace(**plain)
    del content["rng_state"]  # placeholders cannot be saved again
    return content


def test_legacy_experts_counted_when_args_lack_num_experts(parallel: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(parallel / "legacy_ep2", tmp_path / "legacy"))
    for rank_file in root.glob("iter_0000004/mp_rank_*/model_optim_rng.pt"):
        torch.save(_resave(rank_file, drop=("num_experts",)), rank_file)
    legacy, dist = open_checkpoint(root), open_checkpoint(parallel / "dist_ep2")
    assert "num_experts" not in legacy.config and sorted(legacy.tensors) == sorted(dist.tensors)
    name = "mtp.layers.0.transformer_layer.mlp.experts.local_experts.3.linear_fc1.weight"
    assert _read(legacy, name) == _read(dist, name)


def test_legacy_missing_rank_and_bad_shards(parallel: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(parallel / "legacy_tp2", tmp_path / "legacy"))
    iteration = root / "iter_0000004"
    rank1 = iteration / "mp_rank_01" / "model_optim_rng.pt"
    content = _resave(rank1)
    norm = "mtp.layers.0.enorm.weight"
    content["model"][norm] = content["model"][norm].clone()
    content["model"][norm][3] += 1
    torch.save(content, rank1)
    with pytest.raises(InputError, match=f"{norm} differs between TP ranks 0 and 1"):
        _read(open_checkpoint(root), norm)
    content["model"]["decoder.layers.0.self_attention.linear_qkv.weight"] = torch.zeros(
        8, 32, dtype=torch.bfloat16
    )
    torch.save(content, rank1)
    with pytest.raises(InputError, match="inconsistent shards of decoder.layers.0.self_attention"):
        open_checkpoint(root)
    shutil.rmtree(iteration / "mp_rank_01")
    with pytest.raises(InputError, match=r"iter_0000004: missing rank directory mp_rank_01"):
        open_checkpoint(root)


# --- pickle safety and imports ------------------------------------------------------------


class _Payload:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_payload_is_live(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize("target", ["common.pt", ".metadata", "model_optim_rng.pt"])
def test_malicious_pickles_are_refused(
    single: Path, parallel: Path, tmp_path: Path, target: str
) -> None:
    marker = tmp_path / "pwned"
    if target == "model_optim_rng.pt":
        root = Path(shutil.copytree(parallel / "legacy_tp2", tmp_path / "legacy"))
        victim = root / "iter_0000004" / "mp_rank_00" / target
        torch.save({"args": _Payload(marker), "model": {}}, victim)
    else:
        root = _copy(single, tmp_path)
        victim = root / target
        if target == ".metadata":
            victim.write_bytes(pickle.dumps(_Payload(marker)))
        else:
            torch.save({"args": _Payload(marker)}, victim)
    with pytest.raises(InputError) as e:
        open_checkpoint(root)
    assert str(e.value).startswith(f"{victim}: refusing to unpickle ")
    assert "system (not on the allowlist)" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def test_readers_come_before_hf_and_reading_imports_no_megatron(
    single: Path, parallel: Path
) -> None:
    assert [r.name for r in READERS][:2] == ["megatron-torch-dist", "megatron-legacy"]
    assert isinstance(READERS[0], MegatronDistReader)
    assert isinstance(READERS[1], MegatronLegacyReader)
    script = (
        "import sys\n"
        "from mtpcheck.formats import open_checkpoint\n"
        "for path in sys.argv[1:]:\n"
        "    c = open_checkpoint(path)\n"
        "    b''.join(c.read_chunks('mtp.layers.0.eh_proj.weight', 1 << 20))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('megatron')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(single / "moe"), str(parallel / "legacy_tp2")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_plain_chunks_are_streamed_by_offset_and_others_assembled(
    single: Path, parallel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both paths give the same bytes; only tensors whose chunks are not whole rows (TP splits
    of row-parallel layers along their columns) are assembled from their elements."""
    from mtpcheck.formats import megatron_dist

    assembled: list[str] = []
    real_assemble = megatron_dist._assemble

    def counting(directory: Path, plan: Any) -> Any:
        assembled.append(plan.key)
        return real_assemble(directory, plan)

    roots = [single / "dense", single / "moe", single / "moe_singleton" / "iter_0000003"]
    roots += [parallel / f"dist_{run}" for run in ("tp2", "pp2", "ep2")]
    by_root: dict[str, list[str]] = {}
    for root in roots:
        ckpt = MegatronDistReader().open(root)
        assembled.clear()
        monkeypatch.setattr(megatron_dist, "_assemble", counting)
        streamed = {name: _read(ckpt, name, chunk_bytes=40) for name in ckpt.tensors}
        monkeypatch.setattr(megatron_dist, "_assemble", real_assemble)
        for name, plan in ckpt.plans.items():
            whole = real_assemble(Path(ckpt.directory), plan)
            assert streamed[name] == np.ascontiguousarray(whole).tobytes(), (root.name, name)
        by_root[root.name] = sorted(set(assembled))
    assert by_root["dist_tp2"] == [  # row-parallel layers: split along their columns
        "decoder.layers.mlp.linear_fc2.weight",
        "decoder.layers.self_attention.linear_proj.weight",
        "mtp.layers.0.transformer_layer.mlp.linear_fc2.weight",
        "mtp.layers.0.transformer_layer.self_attention.linear_proj.weight",
    ]
    assert all(by_root[r] == [] for r in by_root if r != "dist_tp2"), by_root


def test_megatron_checkpoints_are_read_without_torch(parallel: Path, single: Path) -> None:
    """The core install reads both Megatron formats: ``.metadata``, ``common.pt`` and the
    rank files through stand-ins, tensors by offset or assembled with numpy (TP column splits,
    SwiGLU halves, replicated tensors checked across ranks), with torch unimportable."""
    singleton = single / "moe_singleton" / "iter_0000003"
    for path in (parallel / "legacy_tp2", parallel / "dist_tp2", singleton):
        run = run_core("inspect", str(path), "--format", "json")
        assert run.returncode == 0, run.stderr
        stderr_lines(run)
        assert json.loads(run.stdout)["ok"]
    for a, b in (("legacy_tp2", "dist_tp2"), ("legacy_ep2", "dist_ep2")):
        run = run_core("diff", str(parallel / a), str(parallel / b), "--all", "--format", "json")
        assert run.returncode == 0, run.stderr
        stderr_lines(run)
        report = json.loads(run.stdout)
        (tensors,) = [c for c in report["checks"] if c["name"] == CheckName.TENSORS]
        assert tensors["status"] == "pass", tensors
        assert {t["status"] for t in report["tensors"]} == {"equal"}
        assert len(report["tensors"]) == len(open_checkpoint(parallel / b).tensors)
