"""proposer=draft: a separate Qwen3 draft model with its own KV cache.

Greedy speculation gives exactly plain greedy's tokens (float32, CPU, reference config, pages of
16 positions) with a draft whose drafts are mostly rejected, one accepted about half the time
(rollbacks inside and across pages) and the target as its own draft (every draft accepted: k + 1
tokens a step), over length and EOS stops; sampled drafts (greedy=false) keep the target's output
distribution (chi-square, as tests/core/test_speculative.py); bad draft models are one-line errors
before decoding.
"""

from __future__ import annotations

import json
import shutil

import pytest

import tileinfer
from conftest import ROOT, reference_engine, repetitive_prompt
from tileinfer.cli import main
from tileinfer.errors import ConfigError

from dflash_checkpoints import SAMPLING, SEEDS, exact_marginals, sampled_counts_fit
from test_speculative import assert_starts_afresh, eos_for, fits


def engine(folder, draft=None, **kw):
    if draft is not None:
        kw.setdefault("proposer", "draft")
        kw["options"] = {"draft": {"model": str(draft), **kw.pop("draft_options", {})}}
    return reference_engine(folder, **kw)


@pytest.fixture(scope="module")
def case(checkpoint_factory):
    """The target, its plain greedy tokens, and drafts: ``other`` (other weights, drafts almost
    always rejected), ``near`` (the target's weights scaled by 1.2: about half accepted)."""
    target = checkpoint_factory(tokenizer=False)
    plain = engine(target).generate(repetitive_prompt(), max_new_tokens=80)
    drafts = {"other": checkpoint_factory(tokenizer=False, seed=1, layers=1),
              "near": checkpoint_factory(tokenizer=False, std=0.06), "self": target}
    return target, plain, drafts


def _check_draft_cache(e, out):
    """The draft's KV store holds a prefix of the committed sequence."""
    sequence = repetitive_prompt() + out.token_ids
    cached = e.proposer._cached
    assert e.proposer.kv.length == len(cached) and cached == sequence[:len(cached)]


@pytest.mark.parametrize("which", ["other", "near", "self"])
@pytest.mark.parametrize("spec_k", [1, 3, 7])
def test_greedy_draft_speculation_returns_the_greedy_tokens(case, which, spec_k):
    target, plain, drafts = case
    e = engine(target, drafts[which], spec_k=spec_k)
    out = e.generate(repetitive_prompt(), max_new_tokens=80)
    assert out.token_ids == plain.token_ids and out.stats.finish_reason == "length"
    s = out.stats
    rate = s.accepted_tokens / s.drafted_tokens
    if which == "self":
        assert rate == 1.0
    elif which == "near":
        assert 0.2 < rate < 0.9, s  # rollbacks of every length
    else:
        assert rate < 0.1, s
    _check_draft_cache(e, out)
    assert_starts_afresh(e, plain, s, shorter=spec_k == 7)


@pytest.mark.parametrize("spec_k", [1, 3, 7])
def test_the_target_as_its_own_draft_commits_k_plus_one_tokens_a_step(case, spec_k):
    target, plain, drafts = case
    steps = 6
    n = 1 + steps * (spec_k + 1)
    out = engine(target, target, spec_k=spec_k).generate(repetitive_prompt(), max_new_tokens=n)
    assert out.token_ids == plain.token_ids[:n]
    assert out.stats.steps == steps and out.stats.tokens_per_step == spec_k + 1


@pytest.mark.parametrize("spec_k", [3, 7])
def test_eos_stops(case, checkpoint_factory, spec_k):
    target, plain, drafts = case
    eos, index = eos_for(plain.token_ids, 12)
    with_eos = checkpoint_factory(tokenizer=False, eos=eos)  # same weights, an EOS set
    for draft in (drafts["near"], with_eos):  # the latter: the EOS inside an accepted draft
        out = engine(with_eos, draft, spec_k=spec_k).generate(repetitive_prompt(), max_new_tokens=80)
        assert out.token_ids == plain.token_ids[:index + 1]
        assert out.stats.finish_reason == "eos"


def test_sampled_drafts_with_a_greedy_target_keep_the_greedy_tokens(case):
    target, plain, drafts = case
    out = engine(target, drafts["near"], spec_k=3, draft_options={"greedy": False}).generate(
        repetitive_prompt(), max_new_tokens=80)
    assert out.token_ids == plain.token_ids


def test_sampled_drafts_of_the_target_itself_are_all_accepted(case):
    """greedy=false with q = p: the p/q rule accepts every draft (ratio 1)."""
    target, _, _ = case
    e = engine(target, target, spec_k=3, draft_options={"greedy": False}, temperature=1.0, seed=4)
    out = e.generate(repetitive_prompt(), max_new_tokens=1 + 5 * 4)
    assert out.stats.accepted_tokens == out.stats.drafted_tokens == 15
    assert e.generate(repetitive_prompt(), max_new_tokens=21).token_ids == out.token_ids  # seeded


# -- the output distribution with sampled drafts --------------------------------------------------------



def test_sampled_draft_speculation_keeps_the_target_distribution(checkpoint_factory):
    """Tokens 2 and 3 (the first speculative step, k = 2: accepted drafts, corrections, bonus
    tokens) over SEEDS seeds against their exact marginals under the target; the same test rejects
    the draft's own marginals, so it has power. SEEDS generations: 1-layer variants of the target
    and of its ``near`` draft."""
    target = checkpoint_factory(tokenizer=False, layers=1)
    near = checkpoint_factory(tokenizer=False, layers=1, std=0.06)
    prompt = repetitive_prompt()[:8]
    p = exact_marginals(engine(target, **SAMPLING), prompt, 3)
    q = exact_marginals(engine(near, **SAMPLING), prompt, 3)
    e = engine(target, near, spec_k=2, draft_options={"greedy": False}, **SAMPLING)
    sampled_counts_fit(e, prompt, p, accepted=(0.3, 0.95))
    for i in (1, 2):
        assert not fits((SEEDS * q[i]).round(), p[i])  # the draft's distribution would fail


# -- the shipped pair --------------------------------------------------------------------------------


def test_the_shipped_target_drafts_with_the_shipped_draft_by_default():
    from tileinfer.models import prompts
    greedy = dict(temperature=0.0, repetition_penalty=1.0)  # plain greedy: the shipped default penalizes copying
    plain = tileinfer.Engine.from_config("reference", device="cpu", dtype="float32", progress=False, **greedy)
    e = tileinfer.Engine.from_config("reference", proposer="draft", device="cpu", dtype="float32", progress=False,
                                     **greedy)
    assert e.proposer.folder.resolve() == (ROOT / "models" / "draft").resolve()
    edit = prompts.benchmark_prompts(plain.tokenizer, 300)[0]
    assert edit.task == "edit"
    want = plain.generate(edit.token_ids, max_new_tokens=48)
    got = e.generate(edit.token_ids, max_new_tokens=48)
    assert got.token_ids == want.token_ids
    assert got.stats.tokens_per_step > 2, got.stats  # the draft copies the file being edited


# -- bad input ---------------------------------------------------------------------------------------


def test_a_missing_draft_folder_fails_before_any_weight_loads(case, tmp_path):
    target, _, _ = case
    with pytest.raises(ConfigError, match="draft model folder not found") as err:
        engine(target, tmp_path / "nowhere", spec_k=3)
    assert "\n" not in str(err.value)


def test_a_draft_with_another_vocabulary_is_an_error(case, checkpoint_factory):
    target, _, _ = case
    with pytest.raises(ConfigError, match="vocab_size 256, the target 320") as err:
        engine(target, checkpoint_factory(tokenizer=False, vocab=256), spec_k=3)
    assert "\n" not in str(err.value)


def test_a_draft_with_another_tokenizer_is_an_error(checkpoint_factory, tmp_path):
    target = checkpoint_factory()  # with tokenizer.json
    draft = tmp_path / "draft"
    shutil.copytree(target, draft)
    tokenizer = json.loads((draft / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[40:42]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError, match="another tokenizer"):
        engine(target, draft, spec_k=3)
    assert engine(target, target, spec_k=3).proposer.folder == target  # the same tokenizer is fine


def test_the_default_draft_needs_the_shipped_target(case):
    target, _, _ = case
    with pytest.raises(ConfigError, match="needs options.draft.model=DIR"):
        engine(target, proposer="draft", spec_k=3)


def test_spec_k_beyond_the_draft_context_is_an_error(case, checkpoint_factory):
    target, _, _ = case
    short = checkpoint_factory(tokenizer=False, max_positions=8)
    with pytest.raises(ConfigError, match="spec_k=8 needs 9 positions"):
        engine(target, short, spec_k=8)


def test_cli_errors_are_one_line(case, checkpoint_factory, capsys):
    target, _, _ = case
    for argv in (["config", f"model={target}", "proposer=draft", "options.draft.model=/no/such/draft"],
                 ["generate", "--model", str(target), "--prompt-ids", "5,6,7", "device=cpu", "proposer=draft",
                  f"options.draft.model={checkpoint_factory(tokenizer=False, vocab=256)}"]):
        status = main(argv)
        out, err = capsys.readouterr()
        assert status == 2 and out == ""
        assert err.startswith("error: ") and err.count("\n") == 1 and err.count("error:") == 1, err


@pytest.mark.gpu
def test_the_drafts_steps_replayed_from_cuda_graphs_give_the_eager_drafts(checkpoint_factory):
    """On a GPU with cuda_graphs the draft's steps replay graphs (StepRunner) and draft exactly what
    its eager steps draft: the same tokens, steps and accepted drafts (bfloat16, default kernels; the
    sequential loop: the device loop calls the draft's model inside its own graph)."""
    target = checkpoint_factory(max_positions=512)
    draft = checkpoint_factory(layers=1, seed=1, max_positions=512)
    runs = {}
    for graphs in (True, False):
        e = tileinfer.Engine.from_config(model=str(target), device="cuda", kv_page_size=16, progress=False,
                                         proposer="draft", spec_k=5, cuda_graphs=graphs, temperature=0.0,
                                         pipelined=False, options={"draft": {"model": str(draft)}})
        assert e.proposer.steps.graphed == graphs
        runs[graphs] = e.generate(repetitive_prompt(), max_new_tokens=48, ignore_eos=True)
    assert runs[True].token_ids == runs[False].token_ids
    assert runs[True].stats.drafted_tokens == runs[False].stats.drafted_tokens > 0
    assert runs[True].stats.accepted_tokens == runs[False].stats.accepted_tokens
