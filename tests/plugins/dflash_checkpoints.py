"""Random-weight DFlash drafters in z-lab's format, and an independent plain-torch drafter forward.

``make_dflash`` writes config.json (transformers' Qwen3Config with non-default values, plus z-lab's
keys: architectures ["DFlashDraftModel"], block_size, num_target_layers, dflash_config) and one
model.safetensors whose names carry no ``model.`` prefix and hold no embedding or lm_head.

``reference_logits`` is the drafter written from the spec (shared/notes/dflash.md section 1) in
plain torch over the checkpoint's tensors: it calls none of tileinfer's layers.

``target_and_drafters``: the odd target of the DFlash tests, its plain greedy tokens, and two drafters.

``exact_marginals``: the exact distributions of an engine's first sampled tokens, and
``sampled_counts_fit``, the sampled tokens of a speculative engine checked against them: the
sampled-speculation tests of the dflash and draft proposers.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import tileinfer
from conftest import reference_engine, repetitive_prompt
from tileinfer.interfaces import SamplingParams, Step
from test_speculative import chi2_pvalue, fits

# The odd target of the DFlash tests: 7 layers, hidden 96, GQA 4 / 2 heads of 40 (not 96 / 4).
TARGET = dict(layers=7, hidden=96, heads=4, kv_heads=2, head_dim=40, intermediate=160, vocab=320, tie=True,
              tokenizer=False)


def target_and_drafters(checkpoint_factory, folder: Path,
                        new_tokens: int) -> tuple[Path, tileinfer.Generation, dict[str, Path]]:
    """The odd TARGET, its plain greedy generation of ``new_tokens`` after ``repetitive_prompt()``,
    and two drafters written into ``folder``: ``random`` (drafts rejected), ``one`` (quiet layers:
    every draft is its mask token, the target's most frequent greedy token)."""
    target = checkpoint_factory(**TARGET)
    plain = reference_engine(target).generate(repetitive_prompt(), max_new_tokens=new_tokens)
    common = collections.Counter(plain.token_ids).most_common(1)[0][0]
    drafters = {"random": make_dflash(folder / "random", max_positions=1024),
                "one": make_dflash(folder / "one", mask=common, quiet=1e-3, max_positions=1024)}
    return target, plain, drafters


def make_dflash(folder: Path, *, hidden: int = 96, vocab: int = 320, layers: int = 2, heads: int = 6,
                kv_heads: int = 2, head_dim: int = 20, intermediate: int = 144, block: int = 8,
                num_target_layers: int = 7, target_layer_ids: list[int] | None = (1, 3, 5), mask: int | None = 317,
                seed: int = 0, std: float = 0.08, rope_theta: float = 5000.0, eps: float = 1e-5,
                max_positions: int = 512, block_in_dflash_config: bool = False, quiet: float = 1.0,
                config_edit=None) -> Path:
    """A random drafter. ``quiet`` scales o_proj and down_proj (a small value makes each block
    position's logits close to those of its input embedding: with a tied target, the mask token's
    own row wins, so every draft is the mask token). ``config_edit(dict)`` edits config.json."""
    from transformers import Qwen3Config

    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=max_positions, rms_norm_eps=eps,
                         rope_theta=rope_theta, tie_word_embeddings=False).to_dict()
    config["architectures"] = ["DFlashDraftModel"]
    config["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    config["num_target_layers"] = num_target_layers
    dflash = {}
    if mask is not None:
        dflash["mask_token_id"] = mask
    if target_layer_ids is not None:
        dflash["target_layer_ids"] = list(target_layer_ids)
    if block_in_dflash_config:
        dflash["block_size"] = block
    else:
        config["block_size"] = block
    config["dflash_config"] = dflash
    if config_edit:
        config_edit(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2))

    g = torch.Generator().manual_seed(seed)
    ids = target_layer_ids if target_layer_ids is not None else _default_ids(num_target_layers, layers)

    def matrix(rows: int, cols: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g) * std * scale

    def norm(n: int) -> torch.Tensor:
        return torch.rand(n, generator=g) + 0.5

    tensors = {"fc.weight": matrix(hidden, len(ids) * hidden), "hidden_norm.weight": norm(hidden),
               "norm.weight": norm(hidden)}
    for n in range(layers):
        p = f"layers.{n}."
        tensors.update({
            p + "input_layernorm.weight": norm(hidden), p + "post_attention_layernorm.weight": norm(hidden),
            p + "self_attn.q_proj.weight": matrix(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": matrix(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": matrix(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": matrix(hidden, heads * head_dim, quiet),
            p + "self_attn.q_norm.weight": norm(head_dim), p + "self_attn.k_norm.weight": norm(head_dim),
            p + "mlp.gate_proj.weight": matrix(intermediate, hidden),
            p + "mlp.up_proj.weight": matrix(intermediate, hidden),
            p + "mlp.down_proj.weight": matrix(hidden, intermediate, quiet),
        })
    if quiet < 1:  # drafts follow the input embeddings: norms of ones keep the mask token's row on top
        tensors["norm.weight"] = torch.ones(hidden)
    save_file({k: v.to(torch.bfloat16).float().contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


def _default_ids(num_target: int, num_draft: int) -> list[int]:
    if num_draft == 1:
        return [num_target // 2]
    return [int(round(1 + i * (num_target - 4) / (num_draft - 1))) for i in range(num_draft)]


# -- the independent reference ---------------------------------------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` ``[T, heads, d]`` at ``positions``."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * inv[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + half * sin


def reference_logits(folder: Path, features: torch.Tensor, block: list[int], embed: torch.Tensor,
                     head: torch.Tensor) -> torch.Tensor:
    """The drafter's logits ``[B - 1, V]`` (float64) for the block ``block`` at positions
    ``s .. s+B-1`` after ``s`` context positions whose concatenated target features are
    ``features`` ``[s, K*H]``; ``embed`` and ``head`` are the target's ``[V, H]``."""
    cfg = json.loads((folder / "config.json").read_text())
    w = {k: v.double() for k, v in load_file(folder / "model.safetensors").items()}
    eps, theta = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    s, b = features.shape[0], len(block)
    ctx_pos, blk_pos = torch.arange(s), torch.arange(s, s + b)
    c = _rms(features.double() @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # [s, H]
    h = embed.double()[torch.tensor(block)]  # [B, H]
    for n in range(cfg["num_hidden_layers"]):
        p = f"layers.{n}."
        x = _rms(h, w[p + "input_layernorm.weight"], eps)
        q = _rope(_rms((x @ w[p + "self_attn.q_proj.weight"].T).view(b, nh, d), w[p + "self_attn.q_norm.weight"], eps),
                  blk_pos, theta)

        def keys(src, pos):
            k = (src @ w[p + "self_attn.k_proj.weight"].T).view(-1, nkv, d)
            return _rope(_rms(k, w[p + "self_attn.k_norm.weight"], eps), pos, theta)

        k = torch.cat([keys(c, ctx_pos), keys(x, blk_pos)])  # [s + B, nkv, d]
        v = torch.cat([c, x]) @ w[p + "self_attn.v_proj.weight"].T
        v = v.view(-1, nkv, d)
        group = nh // nkv
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [s + B, nh, d]
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)  # no mask: every query sees every key
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(b, nh * d)
        h = h + out @ w[p + "self_attn.o_proj.weight"].T
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return _rms(h[1:], w["norm.weight"], eps) @ head.double().T


def next_probs(e, ids: list[int]) -> torch.Tensor:
    """The engine's sampling distribution (float64) of the token after ``ids``, from a fresh cache."""
    e.kv.reset()
    e.kv.reserve(len(ids))
    logits, _ = e.model.forward(torch.tensor(ids), Step.at(0, len(ids), e.device), e.kv, last_only=True)
    return e.sampler.probs(logits)[0].double()


def exact_marginals(e, prompt: list[int], n: int) -> list[torch.Tensor]:
    """Exact distributions of the first ``n`` sampled tokens (top-k keeps the paths few)."""
    out, paths = [], {(): 1.0}
    for _ in range(n):
        marginal, longer = 0, {}
        for path, weight in paths.items():
            p = next_probs(e, prompt + list(path))
            marginal = marginal + weight * p
            longer.update({path + (t,): weight * float(p[t]) for t in p.nonzero().flatten().tolist()})
        out.append(marginal)
        paths = longer
    return out


SAMPLING = dict(temperature=1.0, top_k=3)  # the sampled-speculation runs (top-k keeps the exact paths few)
SEEDS = 1500  # generations per sampled-speculation test


def sampled_counts_fit(e, prompt: list[int], p: list[torch.Tensor],
                       accepted: tuple[float, float]) -> dict[int, torch.Tensor]:
    """Tokens 2 and 3 (the first speculative step of ``e``, k = 2: accepted drafts, corrections,
    bonus tokens) of ``SEEDS`` seeded generations under ``SAMPLING``, counted per position
    (``{1: counts, 2: counts}``). Asserts that the share of accepted drafts lies inside
    ``accepted`` (both paths of the rule taken) and that each position's counts fit its exact
    marginal ``p[i]`` (chi-square); returns the counts for a test of power."""
    runs = [e.generate(prompt, max_new_tokens=3, sampling=SamplingParams(**SAMPLING, seed=s)) for s in range(SEEDS)]
    low, high = accepted
    assert low < sum(r.stats.accepted_tokens for r in runs) / sum(r.stats.drafted_tokens for r in runs) < high
    counts = {}
    for i in (1, 2):
        counts[i] = torch.bincount(torch.tensor([r.token_ids[i] for r in runs]), minlength=p[i].numel())
        assert fits(counts[i], p[i]), (i, chi2_pvalue(counts[i], p[i]))
    return counts
