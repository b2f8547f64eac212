"""proposer=dflash: a DFlash block drafter (z-lab's format) on the target's hidden states.

The target is an odd random Qwen3 (7 layers, hidden 96, GQA 4 / 2 heads of 40); the drafters are
random z-lab-format checkpoints (2 layers, 6 / 2 heads of 20, 3 target layer ids, block 8):

- the drafter's forward equals an independent plain-torch drafter written from the spec
  (tests/plugins/dflash_checkpoints.py), with the context cached over several passes across page
  boundaries, and its first drafts equal that reference fed with transformers' hidden states;
- greedy speculation gives exactly plain greedy's tokens (float32, CPU, reference config, pages of
  16 positions) with a drafter whose drafts are always rejected and one that proposes one token
  (accepted through runs of it: rollbacks of every length), over length and EOS stops;
- sampled speculation (drafts greedy or sampled) keeps the target's output distribution
  (chi-square, as tests/core/test_speculative.py), on a 2-layer variant of the target.
"""

from __future__ import annotations

import collections

import pytest
import torch

from conftest import ROOT, reference_engine, repetitive_prompt

from dflash_checkpoints import (SAMPLING, TARGET, exact_marginals, make_dflash, reference_logits, sampled_counts_fit,
                                target_and_drafters)
from test_speculative import assert_starts_afresh, fits


def engine(target, drafter=None, greedy: bool = True, **kw):
    if drafter is not None:
        kw.setdefault("proposer", "dflash")
        kw["options"] = {"dflash": {"model": str(drafter), "greedy": greedy}}
    return reference_engine(target, **kw)


@pytest.fixture(scope="module")
def case(checkpoint_factory, tmp_path_factory):
    return target_and_drafters(checkpoint_factory, tmp_path_factory.mktemp("dflash"), 80)


# -- the drafter's forward -----------------------------------------------------------------------------


def _target_head(e) -> torch.Tensor:
    return e.model.embed  # TARGET ties the lm_head to the embedding


def test_forward_matches_the_independent_reference_over_cached_passes(case):
    """Context of 13 positions and a block, then 6 more (crossing the page at 16) and a block, then
    none and a block: each pass's logits equal the reference over the whole context so far."""
    target, _, drafters = case
    e = engine(target, drafters["random"], spec_k=7)
    drafter, kv = e.proposer.model, e.proposer.kv
    ids = drafter.config.target_layer_ids
    g = torch.Generator().manual_seed(3)
    hidden = {i: torch.randn(19, 96, generator=g) for i in ids}
    features = torch.cat([hidden[i] for i in ids], dim=-1)  # [19, 3 * 96]
    kv.reset()
    cached = 0
    for end, block in ((13, [5, 317, 317, 317, 317, 317, 317, 317]), (19, [9] + [317] * 7), (19, [11] + [317] * 7)):
        context = drafter.project({i: h[cached:end] for i, h in hidden.items()})
        got = drafter.forward(context, torch.tensor(block), cached, kv)
        assert kv.length == end + 8
        kv.truncate(end)
        cached = end
        want = reference_logits(drafters["random"], features[:end], block, e.model.embed, _target_head(e))
        assert got.shape == (7, 320) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-4)


def test_first_drafts_follow_transformers_hidden_states(case):
    """The first pass of a generation sees the prompt's hidden states of layers 1, 3, 5 (HF
    ``hidden_states[id + 1]``); its drafts are the reference's argmax."""
    from transformers import Qwen3ForCausalLM

    target, _, drafters = case
    e = engine(target, drafters["random"], spec_k=7)
    seen = []
    propose = e.proposer.propose

    def record(tokens, k):
        draft = propose(tokens, k)
        seen.append((list(tokens), draft.tokens))
        return draft

    e.proposer.propose = record
    prompt = repetitive_prompt()[:21]
    e.generate(prompt, max_new_tokens=9)
    tokens, drafts = seen[0]
    assert tokens[:-1] == prompt and len(drafts) == 7
    hf = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        states = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    features = torch.cat([states[i + 1][0] for i in (1, 3, 5)], dim=-1)
    want = reference_logits(drafters["random"], features, [tokens[-1]] + [317] * 7, hf.model.embed_tokens.weight,
                            hf.lm_head.weight)
    assert drafts == want.argmax(-1).tolist()


# -- greedy speculation --------------------------------------------------------------------------------


def _check_state(e, sequence):
    """The drafter's store holds the context of every committed position the target has run, no more."""
    p = e.proposer
    assert p.kv.length == p._absorbed == len(sequence) - 1


@pytest.mark.parametrize("which", ["random", "one"])
@pytest.mark.parametrize("spec_k", [1, 3, 7])
def test_greedy_dflash_speculation_returns_the_greedy_tokens(case, which, spec_k):
    target, plain, drafters = case
    e = engine(target, drafters[which], spec_k=spec_k)
    kept = []
    accept = e.proposer.accept

    def record(tokens, num_accepted, hidden):
        kept.append(num_accepted)
        accept(tokens, num_accepted, hidden)

    e.proposer.accept = record
    out = e.generate(repetitive_prompt(), max_new_tokens=80)
    assert out.token_ids == plain.token_ids and out.stats.finish_reason == "length"
    s = out.stats
    rate = s.accepted_tokens / s.drafted_tokens
    if which == "one":  # whole drafts accepted through runs of its token, partial ones at their ends
        assert 0.1 < rate < 0.95 and {0, spec_k} <= set(kept), (s, kept)
        assert spec_k == 1 or set(kept) - {0, spec_k}, kept
    else:
        assert rate < 0.05, s
    _check_state(e, repetitive_prompt() + out.token_ids)
    assert_starts_afresh(e, plain, s, shorter=spec_k == 7)


@pytest.mark.parametrize("spec_k", [3, 7])
def test_eos_stops(case, checkpoint_factory, spec_k):
    """EOS as a correction token, and inside an accepted draft (the one-token drafter proposes it)."""
    target, plain, drafters = case
    common = collections.Counter(plain.token_ids).most_common(1)[0][0]
    for eos in (common, next(t for t in plain.token_ids if t != plain.token_ids[0] and t != common)):
        index = plain.token_ids.index(eos)
        with_eos = checkpoint_factory(**TARGET, eos=eos)  # same weights, an EOS set
        for which in ("random", "one"):
            out = engine(with_eos, drafters[which], spec_k=spec_k).generate(repetitive_prompt(), max_new_tokens=80)
            assert out.token_ids == plain.token_ids[:index + 1], (eos, which)
            assert out.stats.finish_reason == "eos"


def test_the_block_sets_how_far_it_drafts(case):
    """spec_k = B - 1 = 7 drafts 7 tokens a step; a step commits at most 8."""
    target, plain, drafters = case
    out = engine(target, drafters["one"], spec_k=7).generate(repetitive_prompt(), max_new_tokens=80)
    assert out.stats.drafted_tokens <= 7 * out.stats.steps
    assert out.stats.tokens_per_step <= 8 and out.stats.tokens_per_step > 1.5


def test_sampled_drafts_with_a_greedy_target_keep_the_greedy_tokens(case):
    target, plain, drafters = case
    out = engine(target, drafters["one"], greedy=False, spec_k=3).generate(repetitive_prompt(), max_new_tokens=80)
    assert out.token_ids == plain.token_ids


# -- the output distribution under sampling ----------------------------------------------------------

# SEEDS generations each, whose cost is mostly the layers: the odd target with 2 layers instead of 7 (seed 5:
# its likeliest first token has about a third of the mass at the next two positions too), a 1-layer drafter
# reading both.
SAMPLED_TARGET = {**TARGET, "layers": 2, "seed": 5}


@pytest.fixture(scope="module")
def sampled_case(checkpoint_factory, tmp_path_factory):
    """The 2-layer target, the exact marginals of its first 3 sampled tokens after an 8-token prompt,
    and a drafter whose drafts are the target's likeliest first token."""
    target = checkpoint_factory(**SAMPLED_TARGET)
    prompt = repetitive_prompt()[:8]
    p = exact_marginals(engine(target, **SAMPLING), prompt, 3)
    likeliest = int(p[0].argmax())
    drafter = make_dflash(tmp_path_factory.mktemp("dflash") / "likeliest", mask=likeliest, quiet=1e-3,
                          max_positions=1024, layers=1, num_target_layers=2, target_layer_ids=(0, 1))
    return target, prompt, p, likeliest, drafter


@pytest.mark.parametrize("greedy_drafts", [True, False])
def test_sampled_dflash_speculation_keeps_the_target_distribution(sampled_case, greedy_drafts):
    """Tokens 2 and 3 (the first speculative step, k = 2: accepted drafts, corrections, bonus
    tokens) over SEEDS seeds against their exact marginals under the target. The drafter proposes the
    target's likeliest first token (about a third accepted); the test rejects a distribution 15 %
    biased toward it, so it has power."""
    target, prompt, p, likeliest, drafter = sampled_case
    e = engine(target, drafter, greedy=greedy_drafts, spec_k=2, **SAMPLING)
    for i, counts in sampled_counts_fit(e, prompt, p, accepted=(0.25, 0.95)).items():
        biased = 0.85 * p[i] + 0.15 * torch.nn.functional.one_hot(torch.tensor(likeliest), p[i].numel()).double()
        assert not fits(counts, biased)


# -- on a GPU: the Triton kernels ---------------------------------------------------------------------


@pytest.mark.gpu
def test_triton_drafter_matches_the_reference_on_a_gpu(checkpoint_factory, tmp_path):
    """The drafter on the Triton linear and attention (non-causal paged attention), float16,
    against the independent reference; greedy speculation keeps plain greedy's tokens there too."""
    import tileinfer

    # The Triton attention takes power-of-two head sizes (Qwen3's are 64 and 128): the odd-shaped
    # fixtures with head_dim 32 for the target and 16 for the drafter.
    target = checkpoint_factory(**{**TARGET, "head_dim": 32})
    drafters = {"random": make_dflash(tmp_path / "random", head_dim=16, max_positions=1024)}
    e = tileinfer.Engine.from_config(model=str(target), device="cuda", dtype="float16", kv_page_size=16,
                                     proposer="dflash", spec_k=7, progress=False,
                                     options={"dflash": {"model": str(drafters["random"])}})
    drafter, kv = e.proposer.model, e.proposer.kv
    ids = drafter.config.target_layer_ids
    g = torch.Generator().manual_seed(5)
    hidden = {i: torch.randn(21, 96, generator=g).half().cuda() for i in ids}
    kv.reset()
    got = drafter.forward(drafter.project(hidden), torch.tensor([5] + [317] * 7, device="cuda"), 0, kv)
    want = reference_logits(drafters["random"], torch.cat([hidden[i].float().cpu() for i in ids], -1),
                            [5] + [317] * 7, e.model.embed.float().cpu(), e.model.embed.float().cpu())
    torch.testing.assert_close(got.double().cpu(), want, atol=3e-2, rtol=3e-2)
    plain = tileinfer.Engine.from_config(model=str(target), device="cuda", dtype="float16", kv_page_size=16,
                                         progress=False)
    want_ids = plain.generate(repetitive_prompt(), max_new_tokens=40).token_ids
    assert e.generate(repetitive_prompt(), max_new_tokens=40).token_ids[:8] == want_ids[:8]


# -- the shipped drafter --------------------------------------------------------------------------------


def test_the_shipped_target_drafts_with_the_shipped_dflash_drafter_by_default():
    """models/dflash (models/train_dflash.py): used by default with the shipped target, greedy
    tokens kept, drafts accepted on the EDIT task, and the shipped models within 48 MB."""
    import tileinfer

    models = ROOT / "models"
    if not (models / "dflash" / "config.json").is_file():
        pytest.skip("models/dflash/ is not there yet: trained on a GPU by models/train_dflash.py (models/README.md)")
    weights = sum(p.stat().st_size for name in ("target", "draft", "dflash")
                  for p in (models / name).glob("*.safetensors"))
    assert weights <= 48_000_000, f"{weights / 1e6:.1f} MB of weights"
    from tileinfer.models import prompts
    greedy = dict(temperature=0.0, repetition_penalty=1.0)  # plain greedy, not the shipped defaults' penalty
    plain = tileinfer.Engine.from_config("reference", device="cpu", dtype="float32", progress=False, **greedy)
    e = tileinfer.Engine.from_config("reference", proposer="dflash", device="cpu", dtype="float32", progress=False,
                                     **greedy)
    assert e.proposer.folder.resolve() == (models / "dflash").resolve()
    edit = prompts.benchmark_prompts(plain.tokenizer, 300)[0]
    assert edit.task == "edit"
    want = plain.generate(edit.token_ids, max_new_tokens=48)
    got = e.generate(edit.token_ids, max_new_tokens=48)
    assert got.token_ids == want.token_ids
    assert got.stats.tokens_per_step > 2, got.stats
