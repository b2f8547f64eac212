"""The tiles of the linear (linear.py): the configs of its kernels and the rule that picks them from
the weight's shape, the step's tokens and the weight's format; a table with one row per format
("none": weights in the model dtype; "int8": W8A16, int8 rows and float32 row scales). Tiles come
from the rule, not run-time autotuning, so that a fused call and the per-op calls it replaces run
the same tiles. Measured on an H200 over the Qwen3-0.6B / 4B layers (``python -m bench kernels
linear``); a record named ``kind@commit`` is in bench/results/NVIDIA-H200/records.jsonl. The
counters of the split-K sums are sized here too."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from tileinfer.backends.triton import SMALL_STEP_MAX_TOKENS
from tileinfer.backends.triton.interpreter import DEFAULT_NUM_SMS

WEIGHT_FORMATS = ("none", "int8")
LM_HEAD_ROWS = 32768  # weight rows from which a GEMV is an lm_head-sized stream (vocabulary rows)
SMEM_BYTES = 232448  # shared memory one program may use on an H100 / H200 (Triton's hardware limit)


# How a kernel turns int8 weights into floats (``int8_to``'s BITS of device_functions.py): Triton's
# cast, the bit patterns, the bit patterns built by byte permutes (inline PTX: a GPU only). The same
# values each way.
INT8_CONVERTS = {"cast": 0, "bits": 1, "permute": 2}


@dataclass(frozen=True)
class GemvConfig:
    """Tiles of the GEMV (T <= 16, linear_gemv.py)."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    fused_reduce: bool = False  # split-K: the last split's program adds the partials (no reduce kernel)
    late_launch: bool = False  # with PDL: the next kernel may launch after the K loop, not at the start
    int8_convert: str = "bits"  # int8 weights -> float: INT8_CONVERTS

    def __post_init__(self):
        assert self.int8_convert in INT8_CONVERTS, f"int8_convert is one of {', '.join(INT8_CONVERTS)}: {self}"


@dataclass(frozen=True)
class GemmConfig:
    """Tiles of the GEMM (T > 16, linear_gemm.py). ``swap_ab``: the tile computed transposed (``w
    x^T``). The fields after it select the persistent kernel of linear_gemm_persistent.py
    (``persistent``) and its options: ``tma`` (x and weight tiles through TMA descriptors where the
    tensors allow them), ``flatten`` (``tl.range``'s, on the tile loop: the next tile's loads may be
    issued during this one's epilogue), ``split_rows`` / ``split_k`` (the last row blocks computed
    in ranges of K; :func:`split_plan` is the rule) and ``programs`` (the grid; 0: one per SM)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    int8_convert: str = "bits"  # int8 weights -> float: INT8_CONVERTS
    swap_ab: bool = False
    persistent: bool = False
    tma: bool = False
    flatten: bool = False
    split_rows: int = 0
    split_k: int = 1
    programs: int = 0

    def __post_init__(self):
        assert self.int8_convert in INT8_CONVERTS, f"int8_convert is one of {', '.join(INT8_CONVERTS)}: {self}"
        options = dict(tma=self.tma, flatten=self.flatten, split_rows=self.split_rows, split_k=self.split_k != 1,
                       programs=self.programs)
        set_without = [k for k, v in options.items() if v and not self.persistent]
        assert not set_without, f"{', '.join(set_without)} need persistent=True: {self}"
        assert self.split_rows >= 0 and self.split_k >= 1 and self.programs >= 0, f"bad split or programs: {self}"
        # the split tail's epilogue branches; Triton 3.6 fails to flatten a loop with an if in it
        assert not (self.flatten and self.split_rows), f"flatten and split_rows exclude each other: {self}"
        # On an H200 (Triton 3.6) the transposed split tail gives wrong sums (fused and per-op forms 1.2
        # apart at the Qwen3 shapes) where the interpreter agrees with the twin; the measurement is in
        # docs/performance-log.md.
        assert not (self.swap_ab and self.split_rows), f"swap_ab and split_rows exclude each other: {self}"


# -- the GEMV (T <= 16) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemvRule:
    """One weight format's GEMV tiles, each ``(BLOCK_N, BLOCK_K, num_warps, num_stages)``.

    - ``decode`` (T = 1, CUDA cores), ``decode_lm_head`` (N >= LM_HEAD_ROWS); ``decode_few``: layers
      with fewer than ``decode_few_below`` programs of ``decode``'s rows per SM.
    - ``verify`` (T = 2..16, tl.dot with M padded to 16), ``verify_wide`` (N >= 16,384),
      ``verify_lm_head``; ``verify_few`` ``(BLOCK_K, num_stages)`` where the grid has fewer than 2
      programs per SM, K then split until it has more than 1.5 (None: ``gemv_split_k``).
    - ``late_launch`` at T = 2..16."""

    decode: tuple[int, int, int, int]
    decode_lm_head: tuple[int, int, int, int]
    decode_few: tuple[int, int, int, int]
    decode_few_below: int
    verify: tuple[int, int, int, int]
    verify_wide: tuple[int, int, int, int]
    verify_lm_head: tuple[int, int, int, int]
    verify_few: tuple[int, int] | None
    late_launch: bool


GEMV_RULES = {
    # T = 1: four 16-byte loads in flight per thread; small programs (4 KB a step, ~40 registers) give
    # every layer >= 256 programs and up to 32 resident per SM, which hides DRAM latency better than
    # bigger tiles or split-K did. Fewer than 16 such programs per SM (Qwen3-4B's qkv, o_proj, down):
    # BLOCK_K 1,024 and 4 warps, the same bytes in flight a thread, twice the threads per SM; a
    # Qwen3-4B step's linears in one graph with PDL 2.17 against 2.29 ms (--decode-step). T = 2..16:
    # small programs again, 4 stages of cp.async in flight; o_proj and down (fewer than 2 programs per
    # SM) BLOCK_K 256, 3 stages, split K. Within 4 % of the best of ~30 swept tiles on every layer
    # but Qwen3-0.6B's o_proj (9 %); 32x128 / 4-warp tiles 1-14 % slower. Late launch: a Qwen3-4B
    # 16-token step after 1,024 positions 3.73 -> 3.27 ms, 2 tokens 3.67 -> 3.22 (the PDL probe,
    # pdl_probe@4395a2d); at T = 1 the early launch stays (2.73 against 2.75 ms). Records: linear@df4a228
    # (T = 16), linear@1cdd707.
    "none": GemvRule(decode=(4, 512, 2, 1), decode_lm_head=(4, 512, 2, 1), decode_few=(4, 1024, 4, 1),
                     decode_few_below=16, verify=(16, 128, 2, 4), verify_wide=(32, 128, 2, 4),
                     verify_lm_head=(64, 128, 4, 3), verify_few=(256, 3), late_launch=True),
    # T = 1: 512 int8 columns (8 rows for an lm_head: 98 % of the copy bandwidth at Qwen3-4B's); fewer
    # than 8 programs of 4 rows per SM (o_proj, down, Qwen3-0.6B's qkv) 2,048 columns and 4 warps.
    # Tiles of the BF16 rule's bytes (1,024 / 2,048 columns) are 11-33 % slower on qkv, gate_up and
    # the lm_head. T = 2..16: 32x128 tiles of 4 warps (64 rows for an lm_head), ``gemv_split_k``: the
    # sweep had no smaller tile, and 128 int8 columns beat 256 on every layer. Late launch not
    # measured. Records: linear@df4a228 (format int8).
    "int8": GemvRule(decode=(4, 512, 2, 1), decode_lm_head=(8, 512, 2, 1), decode_few=(4, 2048, 4, 1),
                     decode_few_below=8, verify=(32, 128, 4, 4), verify_wide=(32, 128, 4, 4),
                     verify_lm_head=(64, 128, 4, 4), verify_few=None, late_launch=False),
}


@functools.lru_cache(maxsize=None)
def gemv_config(N: int, K: int, T: int, sms: int = DEFAULT_NUM_SMS, *, int8: bool = False) -> GemvConfig:
    """Tiles of the GEMV for ``T`` <= 16 tokens on a weight of ``N`` rows (2I for the fused SwiGLU
    weight) and ``K`` columns, in the format's row of ``GEMV_RULES``; BLOCK_K shrinks to
    next_pow2(K) for small K (never below 16).

    Split-K: at T = 1 by ``gemv_split_k``, the partials added by the last split's program
    (``fused_reduce``: one launch fewer, the same bits). No Qwen3 layer splits at T = 1 on an H200,
    so the step that measured it (``fused-reduce`` in the PDL probe, Qwen3-4B after 1,024
    positions, 2.657 against 2.726 ms) ran the default's kernels and does not count for or against
    it. At T = 2..16 the reduce kernel stays: the fused reduce measured 3.670 against 3.665 ms at T
    = 2 and 3.816 against 3.733 at T = 16 (pdl_probe@4395a2d)."""
    assert N >= 1 and K >= 1 and 1 <= T <= SMALL_STEP_MAX_TOKENS
    rule = GEMV_RULES["int8" if int8 else "none"]
    if T == 1:
        few = triton.cdiv(N, rule.decode[0]) < rule.decode_few_below * sms
        block_n, block_k, warps, stages = rule.decode_few if few else (
            rule.decode_lm_head if N >= LM_HEAD_ROWS else rule.decode)
        block_k = min(block_k, max(16, triton.next_power_of_2(K)))
        split = gemv_split_k(N, K, block_n, block_k, sms)
        return GemvConfig(block_n, block_k, split, warps, stages, fused_reduce=split > 1)
    block_n, block_k, warps, stages = (rule.verify_lm_head if N >= LM_HEAD_ROWS else
                                       rule.verify_wide if N >= 16384 else rule.verify)
    programs = triton.cdiv(N, block_n)
    if rule.verify_few is not None and programs < 2 * sms:
        block_k, stages = rule.verify_few
        k_blocks = triton.cdiv(K, min(block_k, max(16, triton.next_power_of_2(K))))
        split = 1
        while 2 * programs * split <= 3 * sms and k_blocks >= 4 * split:
            split *= 2
        split = triton.cdiv(k_blocks, triton.cdiv(k_blocks, split))  # no empty split
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    if rule.verify_few is None or programs >= 2 * sms:
        split = gemv_split_k(N, K, block_n, block_k, sms)
    return GemvConfig(block_n, block_k, split, warps, stages, late_launch=rule.late_launch)


def gemv_split_k(N: int, K: int, block_n: int, block_k: int, sms: int = DEFAULT_NUM_SMS) -> int:
    """SPLIT_K for the given tiles: 1 when the grid has at least 3/4 as many programs as SMs (the
    reduce kernel costs ~2 us, more than the tail it would save); else doubled while the grid has
    fewer than 4 programs per SM and each split keeps at least 2 BLOCK_K chunks, then recomputed
    from the chunks per split (``cdiv``) so that no split is empty."""
    programs = triton.cdiv(N, block_n)
    k_blocks = triton.cdiv(K, block_k)
    if 4 * programs >= 3 * sms:
        return 1
    split = 1
    while programs * split < 4 * sms and k_blocks >= 4 * split:
        split *= 2
    return triton.cdiv(k_blocks, triton.cdiv(k_blocks, split))


@functools.lru_cache(maxsize=None)
def counters_needed(N: int, K: int, sms: int = DEFAULT_NUM_SMS, *, int8: bool = False) -> int:
    """The split-K counters (int32) that the rule's launches on an ``[N, K]`` weight need at any T:
    one per column block of its GEMVs' ``fused_reduce`` launches (T <= 16) and one per tile of its
    GEMMs' split tails (plain, not SwiGLU: T up to the largest persistent BLOCK_M, with TMA); 0
    where it has neither."""
    configs = [gemv_config(N, K, t, sms, int8=int8) for t in range(1, SMALL_STEP_MAX_TOKENS + 1)]
    gemv = max([triton.cdiv(N, c.block_n) for c in configs if c.fused_reduce and c.split_k > 1], default=0)
    rows = max(t[0] for t in PERSISTENT_TILES["int8" if int8 else "none"])
    gemms = [gemm_config(m, N, K, sms, int8=int8, tma=True) for m in range(SMALL_STEP_MAX_TOKENS + 1, rows + 1)]
    return max([gemv] + [c.split_rows * triton.cdiv(N, c.block_n) for c in gemms if c.split_rows])


# -- the GEMM (T > 16) ---------------------------------------------------------------------------------

# Candidates (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, relative throughput of one tile's MMAs)
# of :func:`gemm_config`, per format. The non-persistent kernel's are at most 128 x 128, so that the
# SwiGLU program's two float32 accumulators fit in registers with the plain tile (2 x 64 a thread at 8
# warps); measured at M = 1,024 on the Qwen3-4B / 0.6B layers, 128 x 128 beat 128 x 64 even at 2 waves
# against 3 (o_proj: 52 against 59 us). The int8 rows have 128-byte weight rows in the smaller tiles;
# their throughputs are the BF16 ones (not measured apart).
GEMM_TILES = {
    "none": ((128, 128, 64, 8, 3, 1.00), (64, 128, 64, 4, 4, 0.70), (128, 64, 64, 4, 4, 0.65),
             (64, 64, 64, 4, 4, 0.50)),
    "int8": ((128, 128, 64, 8, 3, 1.00), (64, 128, 128, 4, 3, 0.70), (128, 64, 128, 4, 3, 0.65),
             (64, 64, 128, 4, 3, 0.50)),
}
# The persistent TMA kernel's candidates, the same columns, throughputs on the scale of the table above,
# where TMA descriptors can be made (an sm_90 GPU, aligned tensors), BF16 without SwiGLU; the
# tile loop flattened where its epilogue fits in shared memory beside the pipeline. Measured at T =
# 1,024 on Qwen3-4B (linear@85a0a62), us, the non-persistent rule
# / persistent 128 x 128 x 64 (4 stages, flattened) / 128 x 256 x 64 (flattened) / cuBLAS: qkv 56.9 /
# 49.3 / 56.1 / 44.7, o_proj 51.6 / 48.4 / 42.8 / 30.9, gate_up 172.4 / 155.9 / 143.1 / 143.2, down
# 120.3 / 113.8 / 95.9 / 67.2, lm_head (float32 logits: 128 x 256 not flattened) 1,361 / 1,244 / 1,105
# / 1,221: throughputs 1.06-1.15 (128 x 128) and 1.21-1.25 (128 x 256, qkv 1.35). The fused SwiGLU
# keeps the non-persistent tiles: 170.9 us against 173.1 (persistent 128 x 128) and 200.7 (128 x 256).
# W8A16 (transposed, not flattened): measured on an H100 at T = 1,024 on Qwen3-4B (linear@3b3f30c), us,
# the non-persistent rule (128 x 128 x 64) / persistent 128 x 128 x 128 / 128 x 256 x 128: qkv 84.7 / 63.8 /
# 82.5, o_proj 81.2 / 65.5 / 62.5, gate_up 275.2 / 206.0 / 205.1, down 190.2 / 149.2 / 139.2, lm_head
# 2,056 / 1,618 / 1,509: throughputs 1.24-1.34 and 1.30-1.37 (BLOCK_K 64 tiles: 1.01-1.09, flattened
# 0.80-0.88). Its fused SwiGLU takes the persistent 128 x 128 x 128 tile (345.1 us against 254.0; 128 x
# 256: 411.2): PERSISTENT_SWIGLU_TILES.
# Short prompts (linear@b95a693, H100, T = 50 and 256, Qwen3-4B / 0.6B): the non-persistent W8A16 tiles took
# 1.3-2.4x the best persistent one on every layer but the 4B gate_up (4B o_proj at T = 256: 45.2 against 22.9 us),
# so with TMA the W8A16 rule's plain launches choose among the persistent tiles only (``PERSISTENT_ONLY``; the fused
# SwiGLU keeps the non-persistent ones among its candidates: Qwen3-0.6B's at T = 50 took 15.5 us in the 64 x 64
# tile against 20.6 in the best persistent one, 128 x 64; 4B's 65.6 against 45.6), which gain 128 x 64
# and 64 x 128 tiles of 4 warps, throughputs 0.93 and 0.80 fitted at T = 1,024 (linear@3b3f30c: qkv 89.7 / 104.0
# us, o_proj 68.1 / 79.2, down 151.2 / 174.9 and the fused SwiGLU 344.0 / 417.9 against the 128 x 128 tile's
# 63.8, 65.5, 149.2 and 254.0 at 3, 2, 2 and 10 waves). Its picks cost Qwen3-4B's four layers (fused SwiGLU)
# 114.9 us at T = 50 and 198.5 at T = 256 (best swept: 111.2 and 197.3; with the non-persistent tiles among the
# candidates: 185.8 and 272.1); Qwen3-0.6B 51.8 and 66.9 (66.4 and 82.5). At T = 1,024 the 4B picks are the same.
PERSISTENT_TILES = {
    "none": ((128, 256, 64, 8, 3, 1.22), (128, 128, 64, 8, 4, 1.09)),
    "int8": ((128, 256, 128, 8, 3, 1.35), (128, 128, 128, 8, 3, 1.30), (128, 64, 128, 4, 3, 0.93),
             (64, 128, 128, 4, 3, 0.80)),
}
PERSISTENT_SWIGLU_TILES = {"none": (), "int8": ((128, 128, 128, 8, 3, 1.36), (128, 64, 128, 4, 3, 0.93),
                                                (64, 128, 128, 4, 3, 0.80))}
PERSISTENT_ONLY = {"none": False, "int8": True}
FLATTEN = {"none": True, "int8": False}
# Prompts of one row block (M <= BLOCK_M) where the W8A16 plain tile's grid does not fill the SMs: K split by
# :func:`split_plan` (the split tail, untransposed), measured at T = 50 on the layers where it splits: Qwen3-4B
# o_proj 17.2 against 22.6 us transposed and unsplit, down 30.3 against 49.1; Qwen3-0.6B o_proj 10.9 / 12.3,
# down 11.5 / 16.8. With two row blocks (T = 256) the split lost: 4B down 56.9 against 49.1. BF16 keeps its
# rule (its split tails won on down only: 30.3 against 45.3 us at 4B, T = 50; lost on o_proj).
SPLIT_ONE_ROW_BLOCK = {"none": False, "int8": True}
# The W8A16 GEMM computes its tiles transposed (swap_ab): on an H200 at the Qwen3-4B layers for T = 1,024,
# 3-23 % faster on every layer with the rule's tile (linear@a1a4273; the SwiGLU form was not swept).
SWAP_AB = {"none": False, "int8": True}


@functools.lru_cache(maxsize=None)
def gemm_config(M: int, N: int, K: int, sms: int = DEFAULT_NUM_SMS, *, int8: bool = False, swiglu: bool = False,
                tma: bool = False, out_bytes: int = 2) -> GemmConfig:
    """Tile of the GEMM for ``M`` > 16 rows on a weight of ``N`` rows (2I for the fused SwiGLU weight).

    Rule: for each candidate of the format's ``GEMM_TILES`` (none for a plain launch with ``tma``
    where the format is ``PERSISTENT_ONLY``) and with ``tma`` ``PERSISTENT_TILES`` (``PERSISTENT_SWIGLU_TILES`` for
    ``swiglu``), cost = waves x tile cost, with waves = cdiv(tiles, SMs) (one resident tile per SM),
    tiles = cdiv(M, BM) * cdiv(N, BN) (padded rows and columns cost as much as real ones) and tile
    cost = BM * BN / throughput (K is common to all candidates). The cheapest wins; ties go to the
    earlier tile. GROUP_M = 8; BLOCK_K shrinks to next_pow2(K) for small K (never below 32).
    ``out_bytes``: the output's element size (a BF16 persistent tile loop is flattened only where
    its epilogue tile fits in shared memory beside the pipeline's stages; a W8A16 one never:
    ``FLATTEN``). A persistent plain tile of a ``SPLIT_ONE_ROW_BLOCK`` format with M <= BLOCK_M takes
    :func:`split_plan`'s split tail where it splits (then untransposed)."""
    fmt = "int8" if int8 else "none"
    persistent = (PERSISTENT_SWIGLU_TILES if swiglu else PERSISTENT_TILES)[fmt] if tma else ()
    plain = () if persistent and PERSISTENT_ONLY[fmt] and not swiglu else GEMM_TILES[fmt]
    best, best_cost = None, None
    for n, (bm, bn, bk, warps, stages, speed) in enumerate(plain + persistent):
        cost = triton.cdiv(triton.cdiv(M, bm) * triton.cdiv(N, bn), sms) * bm * bn / speed
        if best_cost is None or cost < best_cost:
            best, best_cost = (bm, bn, bk, warps, stages, n >= len(plain)), cost
    bm, bn, bk, warps, stages, is_persistent = best
    bk = min(bk, max(32, triton.next_power_of_2(K)))
    if not is_persistent:
        return GemmConfig(bm, bn, bk, 8, warps, stages, swap_ab=SWAP_AB[fmt])
    if SPLIT_ONE_ROW_BLOCK[fmt] and not swiglu and M <= bm:
        split_rows, split_k = split_plan(M, N, K, bm, bn, bk, sms)
        if split_rows:
            return GemmConfig(bm, bn, bk, 8, warps, stages, persistent=True, tma=True, split_rows=split_rows,
                              split_k=split_k)
    flatten = FLATTEN[fmt] and stages * (bm + bn) * bk * 2 + bm * bn * out_bytes <= SMEM_BYTES
    return GemmConfig(bm, bn, bk, 8, warps, stages, swap_ab=SWAP_AB[fmt], persistent=True, tma=True, flatten=flatten)


# -- the persistent GEMM's split tail ---------------------------------------------------------------------

# The split rule's cost model (estimates until the sweep measures the split tiles): one SM's MMA
# throughput (the non-persistent BF16 GEMM runs Qwen3-4B's gate_up at T = 1,024 at 578 TFLOP/s on an
# H200, 4.4 per SM: 176.5 us in linear@a1a4273), the
# bandwidth of the partials' write and read (mostly in L2: a guess), and the fixed cost of a split
# (the last units' sums after the others: a guess).
SM_FLOPS = 4.4e12
PARTIAL_BYTES_PER_S = 3.0e12
SPLIT_FIXED_US = 2.0
SPLIT_CANDIDATES = (2, 3, 4, 6, 8)


@functools.lru_cache(maxsize=None)
def balance(dp_tiles: int, dp_cost: int, units: int, unit_cost: int, programs: int) -> tuple[int, int, int]:
    """How many split units each program takes after its whole tiles: ``(n_lo, n_hi, makespan)``.

    Whole tiles go round-robin (program p gets tiles p, p + P, ...): the first ``dp_tiles % P``
    programs hold one more. Programs with that extra tile take ``n_lo`` units, the others ``n_hi``,
    in contiguous ranges (program p's first unit is ``p * n_lo`` for p < r, else ``r * n_lo + (p -
    r) * n_hi``); ``n_hi - n_lo`` covers the missing tile's cost. Costs in BLOCK_K chunks: a whole
    tile ``dp_cost``, a unit ``unit_cost``. ``makespan``: the busiest program's chunks."""
    q, r = divmod(dp_tiles, programs)
    if units == 0:
        return 0, 0, (q + (r > 0)) * dp_cost
    if r == 0:
        n = triton.cdiv(units, programs)
        return n, n, q * dp_cost + n * unit_cost
    d = dp_cost // unit_cost
    n_lo = max(0, triton.cdiv(units - (programs - r) * d, programs))
    n_hi = min(n_lo + d, triton.cdiv(units - r * n_lo, programs - r))
    return n_lo, n_hi, max((q + 1) * dp_cost + n_lo * unit_cost, q * dp_cost + n_hi * unit_cost)


@functools.lru_cache(maxsize=None)
def split_plan(M: int, n_w: int, K: int, block_m: int, block_n: int, block_k: int, programs: int) -> tuple[int, int]:
    """``(split_rows, split_k)`` for a persistent GEMM of ``M`` rows on a weight of ``n_w`` rows
    (plain tiles; 2I for the fused SwiGLU weight, as the per-op chain's plain call sees it).

    Rule: the estimated time of every candidate (no split; or the last ``b`` row blocks in ``s``
    ranges of K, each of at least 2 chunks) is the busiest program's chunks (:func:`balance`) at
    ``SM_FLOPS`` per SM, plus the partials' bytes (written and read once, float32) at
    ``PARTIAL_BYTES_PER_S`` and ``SPLIT_FIXED_US``; the fastest wins, ties to fewer splits. Not in
    :func:`gemm_config`'s rule (Qwen3-4B's down at T = 1,024: 95.0 us against 95.9 unsplit)."""
    k_tiles = triton.cdiv(K, block_k)
    num_pid_m, num_pid_n = triton.cdiv(M, block_m), triton.cdiv(n_w, block_n)
    chunk_us = 2 * block_m * block_n * block_k / SM_FLOPS * 1e6
    best, best_us = (0, 1), balance(num_pid_m * num_pid_n, k_tiles, 0, 1, programs)[2] * chunk_us
    for s in SPLIT_CANDIDATES:
        per_split = triton.cdiv(k_tiles, s)
        if per_split < 2 or triton.cdiv(k_tiles, per_split) != s:
            continue
        for b in range(1, num_pid_m + 1):
            units = b * num_pid_n * s
            span = balance((num_pid_m - b) * num_pid_n, k_tiles, units, per_split, programs)[2]
            partial_bytes = 8 * (M - (num_pid_m - b) * block_m) * n_w * s
            us = span * chunk_us + partial_bytes / PARTIAL_BYTES_PER_S * 1e6 + SPLIT_FIXED_US
            if us < best_us:
                best, best_us = (b, s), us
    return best


__all__ = ["GEMM_TILES", "GEMV_RULES", "LM_HEAD_ROWS", "PERSISTENT_SWIGLU_TILES", "PERSISTENT_TILES", "WEIGHT_FORMATS",
           "GemmConfig", "GemvConfig", "GemvRule", "balance", "counters_needed", "gemm_config", "gemv_config",
           "gemv_split_k", "split_plan"]
