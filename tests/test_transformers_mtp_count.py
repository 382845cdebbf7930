"""Why transformers' own MTP decoding reports a lower acceptance than teacher forcing.

``model.generate(..., use_mtp=True, do_sample=False)`` drafts and verifies exactly what
teacher forcing predicts, but its bookkeeping (``_assisted_decoding`` in
``transformers/generation/utils.py``) cuts the accepted ``[draft, bonus]`` pair to the length
budget and then recomputes ``n_matches`` from what is left: a draft accepted on the last
position the budget allows is counted as rejected. The draft is the main model's own greedy
token, and it stays in the output. This test pins that on the shipped fixture: the same draft
at the same position is counted 0 with ``max_new_tokens=40`` and 1 with 41, and mtpcheck's
draft-then-verify loop accepts it. docs/acceptance/online.md gives the figures.
"""

from __future__ import annotations

import json
import warnings

import pytest

from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "accept_deepseek_v3"
PINNED = "5.24.0"


def _steps(max_new_tokens: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[dict]]:
    """transformers' MTP decoding of document 0 (first 8 words), greedy: the sequence and,
    per drafting step, the draft's position and token and the ``n_matches`` it was given."""
    import torch
    import transformers
    from transformers.generation import candidate_generator

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    cls = transformers.DeepseekV3ForCausalLM
    # transformers finds the MTP layer through this pattern, hard-coded to the released
    # depth (model.layers.61); the fixture's MTP layer is model.layers.2
    monkeypatch.setattr(cls, "_keys_to_ignore_on_load_unexpected", [r"model\.layers\.2.*"])
    model = cls.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    model._keys_to_ignore_on_load_unexpected = [r"model\.layers\.2.*"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(FIXTURE)
    text = json.loads((FIXTURE / "workloads" / "in_domain.jsonl").read_text().splitlines()[0])
    ids = tokenizer(" ".join(text["text"].split()[:8]), return_tensors="pt")["input_ids"]

    steps: list[dict] = []
    generator = candidate_generator.MTPCandidateGenerator
    # the unpatched methods (a second call must not wrap the first call's wrappers)
    get = generator.__dict__.get("_unpatched_get", generator.get_candidates)
    update = generator.__dict__.get("_unpatched_update", generator.update_candidate_strategy)
    monkeypatch.setattr(generator, "_unpatched_get", get, raising=False)
    monkeypatch.setattr(generator, "_unpatched_update", update, raising=False)

    def get_candidates(self, input_ids, **kwargs):  # noqa: ANN001, ANN202
        candidates, logits = get(self, input_ids, **kwargs)
        if candidates.shape[1] > input_ids.shape[1]:
            steps.append({"position": input_ids.shape[1], "draft": int(candidates[0, -1])})
        return candidates, logits

    def update_candidate_strategy(self, input_ids, scores, num_matches):  # noqa: ANN001, ANN202
        if steps and "n_matches" not in steps[-1]:
            steps[-1]["n_matches"] = int(num_matches)
        return update(self, input_ids, scores, num_matches)

    monkeypatch.setattr(generator, "get_candidates", get_candidates)
    monkeypatch.setattr(generator, "update_candidate_strategy", update_candidate_strategy)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, use_mtp=True)
    return out[0].tolist(), steps


def test_an_accepted_draft_at_the_length_limit_is_counted_as_rejected(monkeypatch) -> None:
    import transformers

    if transformers.__version__ != PINNED:
        pytest.skip(f"pinned on transformers {PINNED}; re-check docs/acceptance/online.md")
    from mtpcheck.accept.loading import open_drafter
    from mtpcheck.accept.online import speculative_decode
    from mtpcheck.accept.scoring import score_batch

    at_limit, steps_40 = _steps(40, monkeypatch)
    past_limit, steps_41 = _steps(41, monkeypatch)
    last = len(at_limit) - 1
    [final] = [s for s in steps_40 if s["position"] == last]
    [same] = [s for s in steps_41 if s["position"] == last]
    assert final["draft"] == same["draft"] == at_limit[last] == past_limit[last]
    assert (final["n_matches"], same["n_matches"]) == (0, 1)  # one draft, two verdicts

    # the draft is what teacher forcing predicts there, and the main model's greedy token
    drafter = open_drafter(FIXTURE, dtype="float32")
    hits, _ = score_batch(drafter, [at_limit], 0.0)[0]
    assert bool(hits[last - 2])
    # mtpcheck's draft-then-verify loop, from the same prompt, accepts it
    prompt = at_limit[: len(at_limit) - 40]
    decoded = speculative_decode(drafter, [prompt], new_tokens=40)
    assert decoded.sequences[0][: len(at_limit)] == at_limit
    [ours] = [d for d in decoded.drafts if d.slot == last - 2]
    assert ours.accepted
