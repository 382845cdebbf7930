"""Benchmark 5: ``mtpcheck inspect hf://...`` of a DeepSeek-V3-scale repository, over HTTP.

The sparse DeepSeek-V3 checkpoint of benchmark 3 (163 shards, 91,991 tensors, about 688 GB
declared) is served by the local Hub stand-in of the tests (``tests/hub_server.py``) with an
injected latency per request (default 50 ms), so that the run is latency-bound as against the
real Hub. Each run starts with an empty huggingface_hub cache.

Baseline, in the same run: a bare Python client that issues one range request per shard,
``--concurrency`` at a time (urllib, standard library): the latency-bound floor of "163
requests / concurrency", interpreter start-up included. mtpcheck needs two requests per shard
(the 8-byte header length, then exactly the header: no tensor byte), plus the repository
information, config.json and the index. Reported: medians, the ratio, requests and bytes.

    python benchmarks/bench_hub_inspect.py [--repeats 5] [--latency 0.05] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import alternate, child_env, machine, median, mtpcheck_cmd, print_table, run_measured  # noqa: E402
from bench_inspect_deepseek_scale import generate  # noqa: E402

from tests.hub_server import FakeHub, HubServer  # noqa: E402

TARGET_RATIO = 1.5
REPO = "deepseek-ai/DeepSeek-V3-sparse"

BASELINE = """
import sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
base, concurrency, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def get(name):
    req = urllib.request.Request(f"{base}/{name}", headers={"Range": "bytes=0-7"})
    with urllib.request.urlopen(req) as r:
        return r.read()
with ThreadPoolExecutor(concurrency) as pool:
    assert all(len(b) == 8 for b in pool.map(get, files))
"""


def main() -> int:
    from mtpcheck.formats import hub as hub_module

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    concurrency = hub_module.CONCURRENCY

    work = Path(tempfile.mkdtemp(prefix="mtpbench-hub-", dir=args.workdir))
    try:
        root = work / "DeepSeek-V3"
        root.mkdir()
        count, declared = generate(root)
        shards = sorted(p.name for p in root.glob("*.safetensors"))
        hub = FakeHub(latency=args.latency, hash_headers_only=True)
        hub.add(REPO, root)
        with HubServer(hub) as url:
            env = child_env(work)
            env["HF_ENDPOINT"] = url
            caches = iter(range(10_000))

            def ours() -> object:
                env["HF_HUB_CACHE"] = str(work / f"cache-{next(caches)}")
                return run_measured(mtpcheck_cmd("inspect", f"hf://{REPO}"), env=env)

            files = [f"{url}/{REPO}/resolve/main/{name}" for name in shards]
            baseline_cmd = [sys.executable, "-c", BASELINE, "", str(concurrency)]
            baseline_cmd[3:4] = [files[0].rsplit("/", 1)[0]]
            baseline_cmd += shards

            hub.clear()
            check = ours()
            requests, fetched = len(hub.log), hub.fetched("GET")
            headers_bytes = sum(r.body_bytes for r in hub.log if r.path.endswith(".safetensors"))
            results = alternate(
                {
                    "baseline": lambda: run_measured(baseline_cmd),
                    "mtpcheck": ours,
                },
                args.repeats,
            )
        base = median(m.wall for m in results["baseline"])
        mine = median(m.wall for m in results["mtpcheck"])
        worst = max(m.wall for m in results["mtpcheck"])
        floor = len(shards) * args.latency / concurrency
        print(f"\nmachine: {machine()}")
        print(
            f"repository: {len(shards)} shards, {count} tensors, {declared / 1e9:.0f} GB "
            f"declared; latency {args.latency * 1000:.0f} ms per request, concurrency "
            f"{concurrency}; latency-bound floor {len(shards)} x {args.latency} / "
            f"{concurrency} = {floor:.2f} s"
        )
        print(
            f"mtpcheck: exit {check.returncode}, {requests} requests, {fetched / 1e6:.2f} MB "
            f"fetched (shard headers {headers_bytes / 1e6:.2f} MB, no tensor bytes)"
        )
        print_table(
            f"inspect hf:// of a DeepSeek-V3-scale repository, medians of {args.repeats}",
            [
                ("baseline: 1 range request a shard", f"{base:.3f}", ""),
                ("mtpcheck inspect hf://", f"{mine:.3f}", f"{worst:.3f}"),
            ],
            ("run", "median wall s", "worst wall s"),
        )
        ratio = mine / base
        print(f"ratio mtpcheck / baseline: {ratio:.2f} (target <= {TARGET_RATIO})")
        if floor:
            print(f"ratio mtpcheck / computed floor: {mine / floor:.2f}")
        return 0 if check.returncode == 0 and json.dumps(ratio) and ratio <= TARGET_RATIO else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
