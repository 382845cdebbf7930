"""Compare harness.py's torch replacements with vLLM's own kernels where those kernels work,
and show the rotary defect. Prints one JSON object; exit 1 when a check that should hold
does not.

    /work/venvs/vllm/bin/python tests/thirdparty/vllm/check_kernels.py

* ``rotary``: ``torch.ops._C.rotary_embedding`` (``RotaryEmbedding.forward_cpu``) against
  ``RotaryEmbedding.forward_native`` on 2-D and 3-D queries. Expected: 2-D and one-head 3-D
  agree, several-head 3-D does not (the defect), and the kernel's 3-D result equals "the
  first ``tokens`` head rows rotated, the rest untouched".
* ``moe``: ``harness.torch_moe_experts`` against ``torch.ops._C.cpu_fused_moe`` ("vec") on
  shapes the kernel accepts (hidden and intermediate multiples of 32), float32.
* ``mla_decode``: ``harness.torch_mla_decode`` against ``torch.ops._C.mla_decode_kvcache``
  on the one head size the kernel is built for (576 = 512 + 64), block size 16, float32.
* ``attention``: ``harness.torch_paged_attention`` against
  ``torch.ops._C.cpu_attention_with_kv_cache`` ("vec", block size 32) on head sizes the
  kernel is built for (32, 64), GQA and MQA, with and without a sliding window, mixing a
  prefill chunk, a decode token and a fresh prompt.
* ``router``: the one-group ``_grouped_topk`` call of patch 7 against transformers'
  ``Step3p7TopKRouter`` rule (top-k of sigmoid + bias, sigmoid weights, renormalised).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ["MTPCHECK_VLLM_SKIP_PATCHES"] = ",".join(  # compare against the originals
    ["moe", "mla", "rope", "step3p7", "cpu_attn", "router"]
)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import torch  # noqa: E402


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def check_rotary() -> dict:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(
            8,
            max_position=128,
            is_neox_style=False,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
            dtype=torch.float32,
        )
    g = torch.Generator().manual_seed(0)
    tokens, heads, dim = 5, 2, 8
    pos = torch.arange(tokens)
    out = {}
    for neox in (False, True):
        rope.is_neox_style = neox
        q = torch.randn(tokens, heads, dim, generator=g)
        k = torch.randn(tokens, 1, dim, generator=g)
        cases = {
            "3d_q[T,H,D]": (q, k),
            "2d_q[T,H*D]": (q.reshape(tokens, -1), k.reshape(tokens, -1)),
            "3d_q_one_head": (q[:, :1].contiguous(), k),
        }
        for name, (qq, kk) in cases.items():
            qn, kn = rope.forward_native(pos, qq.clone(), kk.clone())
            qc, kc = rope.forward_cpu(pos, qq.clone(), kk.clone())
            out[f"{'neox' if neox else 'gptj'}:{name}"] = {
                "query_maxdiff": maxdiff(qn, qc),
                "key_maxdiff": maxdiff(kn, kc),
            }
        # what the kernel does with the 3-D several-head query
        qc, _ = rope.forward_cpu(pos, q.clone(), k.clone())
        rows = q.reshape(tokens * heads, 1, dim).clone()
        rows[:tokens], _ = rope.forward_native(pos, rows[:tokens].clone(), None)
        out[f"{'neox' if neox else 'gptj'}:kernel_equals_first_T_rows_rotated"] = bool(
            torch.allclose(rows.reshape(tokens, heads, dim), qc, atol=1e-6)
        )
    ok = all(
        v["query_maxdiff"] < 1e-5 and v["key_maxdiff"] < 1e-5
        for n, v in out.items()
        if isinstance(v, dict) and "3d_q[T,H,D]" not in n
    )
    defect = all(out[f"{s}:3d_q[T,H,D]"]["query_maxdiff"] > 1e-2 for s in ("gptj", "neox"))
    return {"cases": out, "ok_where_expected": ok, "defect_shown": defect}


def check_moe() -> dict:
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    g = torch.Generator().manual_seed(1)
    results = {}
    for tokens, experts, hidden, inter, top_k in ((7, 4, 64, 32, 2), (16, 8, 96, 64, 3)):
        x = torch.randn(tokens, hidden, generator=g)
        w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.1
        w2 = torch.randn(experts, hidden, inter, generator=g) * 0.1
        logits = torch.randn(tokens, experts, generator=g)
        weights, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
        ids = ids.to(torch.int32)
        out = torch.empty(tokens, hidden)
        ops.cpu_fused_moe(
            out,
            x,
            ops.cpu_prepack_moe_weight(w13, "vec"),
            ops.cpu_prepack_moe_weight(w2, "vec"),
            None,
            None,
            weights,
            ids,
            "silu",
            "vec",
            False,
        )
        ref = harness.torch_moe_experts(x, w13, w2, weights, ids, MoEActivation.SILU)
        results[f"T{tokens}_E{experts}_H{hidden}_I{inter}_k{top_k}"] = {
            "maxdiff": maxdiff(out, ref),
            "max_abs": float(out.abs().max()),
        }
    return {"cases": results, "ok": all(v["maxdiff"] < 1e-4 for v in results.values())}


def check_mla_decode() -> dict:
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(2)
    batch, heads, lora, rope, block = 3, 4, 512, 64, 16
    seq_lens = torch.tensor([5, 17, 33], dtype=torch.int32)
    blocks_per_req = 3
    num_blocks = batch * blocks_per_req + 2
    kv = torch.randn(num_blocks, block, lora + rope, generator=g)
    table = torch.randperm(num_blocks, generator=g)[: batch * blocks_per_req]
    table = table.reshape(batch, blocks_per_req).to(torch.int32)
    q = torch.randn(batch, heads, lora + rope, generator=g)
    scale = (lora + rope) ** -0.5
    out = torch.zeros(batch, heads, lora)
    ops.mla_decode_kvcache_cpu(out, q, kv, scale, table, seq_lens)
    ref = harness.torch_mla_decode(q, kv, scale, table, seq_lens, lora)
    d = maxdiff(out, ref)
    return {"maxdiff": d, "max_abs": float(out.abs().max()), "ok": d < 1e-4}


def check_attention() -> dict:
    """``torch_paged_attention`` vs ``torch.ops._C.cpu_attention_with_kv_cache`` ("vec")."""
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(3)
    block, num_blocks = 32, 8
    q_lens, seq_lens = [5, 1, 3], [37, 20, 3]
    results = {}
    for heads, kv_heads, head, window in ((4, 2, 32, -1), (4, 2, 32, 16), (2, 1, 64, 16)):
        table = torch.randperm(num_blocks, generator=g)[:6].reshape(3, 2).to(torch.int32)
        k_all = [torch.randn(n, kv_heads, head, generator=g) for n in seq_lens]
        v_all = [torch.randn(n, kv_heads, head, generator=g) for n in seq_lens]
        slots = torch.cat(
            [
                table[r, torch.arange(n) // block].long() * block + torch.arange(n) % block
                for r, n in enumerate(seq_lens)
            ]
        )
        k_flat, v_flat = torch.cat(k_all), torch.cat(v_all)
        cache = torch.zeros(num_blocks, kv_heads, block, 2 * head)
        key_cache, value_cache = cache.view(num_blocks, kv_heads, 2 * block, head).chunk(2, 2)
        ops.cpu_attn_reshape_and_cache(k_flat, v_flat, key_cache, value_cache, slots, "vec")
        plain = torch.zeros(num_blocks, kv_heads, 2 * block, head)
        pk, pv = plain.chunk(2, 2)
        pk[slots // block, :, slots % block] = k_flat
        pv[slots // block, :, slots % block] = v_flat
        q = torch.randn(sum(q_lens), heads, head, generator=g)
        qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        sl = torch.tensor(seq_lens, dtype=torch.int32)
        scale = head**-0.5
        meta = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=3,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head,
            seq_lens=sl,
            dtype=torch.float32,
            query_start_loc=qsl,
            causal=True,
            sliding_window_size=window,
            isa="vec",
            enable_kv_split=True,
        )
        out = torch.zeros_like(q)
        ops.cpu_attention_with_kv_cache(
            query=q,
            key_cache=key_cache,
            value_cache=value_cache,
            output=out,
            query_start_loc=qsl,
            seq_lens=sl,
            scale=scale,
            causal=True,
            alibi_slopes=None,
            sliding_window=window,
            block_table=table,
            softcap=0.0,
            scheduler_metadata=meta,
            s_aux=None,
        )
        ref = harness.torch_paged_attention(q, pk, pv, qsl, sl, table, scale, window)
        results[f"H{heads}_KV{kv_heads}_D{head}_W{window}"] = {
            "maxdiff": maxdiff(out, ref),
            "max_abs": float(out.abs().max()),
        }
    return {"cases": results, "ok": all(v["maxdiff"] < 1e-4 for v in results.values())}


def check_router() -> dict:
    """One-group ``_grouped_topk`` (harness patch 7) vs transformers' Step3p7TopKRouter rule."""
    from vllm.model_executor.layers.fused_moe.router.cpu_router import _grouped_topk

    g = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 8, generator=g)
    bias = torch.randn(8, generator=g) * 0.3
    w, ids = _grouped_topk(logits, 3, True, 1, 1, "sigmoid", 1.0, bias)
    scores = logits.sigmoid()
    ref_ids = torch.topk(scores + bias, 3, dim=-1).indices
    ref_w = scores.gather(1, ref_ids)
    ref_w = ref_w / ref_w.sum(-1, keepdim=True)
    order, ref_order = ids.long().sort(-1), ref_ids.sort(-1)
    same_ids = torch.equal(order.values, ref_order.values)
    d = maxdiff(w.gather(1, order.indices), ref_w.gather(1, ref_order.indices))
    return {"same_experts": same_ids, "weight_maxdiff": d, "ok": same_ids and d < 1e-6}


def main() -> int:
    result = {
        "rotary": check_rotary(),
        "moe": check_moe(),
        "mla_decode": check_mla_decode(),
        "attention": check_attention(),
        "router": check_router(),
    }
    print(json.dumps(result, indent=1))
    good = (
        result["rotary"]["ok_where_expected"]
        and result["moe"]["ok"]
        and result["mla_decode"]["ok"]
        and result["attention"]["ok"]
        and result["router"]["ok"]
    )
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
