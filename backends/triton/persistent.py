"""The decode step (1..16 tokens) of a Qwen3 decoder stack as one persistent kernel; twin:
backends/reference/persistent.py (``decode_step``, the torch ops one after another), which it equals
up to reduction order: its GEMVs sum ``tl.dot`` products over BLOCK_K chunks, its RMSNorms sum
squares chunk by chunk, its attention sums chunks of positions per split and the splits in order.
Its own rows are batch-invariant: a token's row is the same bits whatever the step's T.

KV pages: in the model dtype, or int8 (``KV_INT8``, ``kv_store=paged_int8``: one float32 scale per
cached vector, the keys divided by a per-layer smoothing where ``SMOOTH``), whose scales and
smoothing the pointer table holds beside the pages. Over int8 pages the step does the per-op
chain's arithmetic with its device functions: the attention-input items quantize the key and the
value as the per-op ``attention_inputs`` kernel does (``store_kv_int8``), and the attention items
smooth the query and attend through ``attend_tiles_int8`` as the per-op decode attention does.

Tiling and grid. Grid: ``programs`` programs, all resident at once (the caller sizes it to the
machine: :func:`resident_programs`). The step is a list of work items in dependency order (built
on the host by :class:`StepPlan`): per layer the qkv GEMV tiles (input RMSNorm in each tile's
prologue), one attention-input item per kv head (q/k RMSNorm, RoPE, the K/V page write),
``NUM_SPLITS`` attention items per kv head (the last one combines), the o_proj tiles (+ residual),
the gate_up tiles (post-attention RMSNorm, SwiGLU), the down tiles (+ residual; o_proj and down
tiles in ``SPLIT_O`` / ``SPLIT_DOWN`` K runs, the last run of a tile adding the runs' sums; a down
run waits for the gate_up tiles of its K range only); then the lm_head tiles (final RMSNorm, float32
logits). Program ``p`` takes items ``p, p + programs, ...`` in order. An item waits on the int32 counter its inputs
increment (persistent_items.py), never on a kernel boundary, and loads its first weight chunk before
it waits. Every GEMV tile is ``[16 tokens, BLOCK_N columns]`` through ``tl.dot`` over ``BLOCK_K``
chunks; every attention item ``[16 * GROUP query rows padded to a power of two (ATTN_ROWS), BLOCK_N
keys]`` tiles. The last program to finish zeroes the counters for the next launch. Under the
interpreter, which runs programs one after another, one program takes every item in order (every
wait is then already satisfied when checked).
"""

from __future__ import annotations

import types

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.persistent_items import (attention_inputs_item, attention_item, gemv_item, signal,
                                                        wait_for)
from tileinfer.backends.triton import persistent_plan as plan_
from tileinfer.backends.triton.linear_tiles import INT8_CONVERTS
from tileinfer.backends.triton.persistent_plan import StepBuffers, StepPlan, StepShape


# The item kinds and the pointer table's width, as constants of the kernel.
QKV, ATTN_IN, ATTN, O_PROJ, GATE_UP, DOWN = (tl.constexpr(k) for k in (plan_.QKV, plan_.ATTN_IN, plan_.ATTN,
                                                                     plan_.O_PROJ, plan_.GATE_UP, plan_.DOWN))
NUM_PTRS = tl.constexpr(plan_.NUM_PTRS)
K_PAGES = tl.constexpr(plan_.LAYER_POINTERS.index("k_pages"))  # then v_pages
K_SCALE = tl.constexpr(plan_.LAYER_POINTERS.index("k_scale"))  # then v_scale, k_smooth


@triton.jit
def _ptr(layer_ptrs, layer, j: tl.constexpr, ty: tl.constexpr):
    """Address ``j`` of ``layer``'s row of the pointer table (``NUM_PTRS`` columns) as a pointer to ``ty``,
    16-byte aligned (every address the table holds is: :func:`persistent_plan.layer_pointer_table`), so
    that the compiler vectorizes the loads through it as through a kernel argument."""
    return tl.multiple_of(tl.load(layer_ptrs + layer * NUM_PTRS + j).to(tl.pointer_type(ty)), 16)


@triton.jit
def _kv(layer_ptrs, layer, act_ty: tl.constexpr, KV_INT8: tl.constexpr):
    """``layer``'s K pages, V pages (int8 where KV_INT8, else ``act_ty``), K scales, V scales and key
    smoothing (float32; placeholders, never read, for pages in the model dtype)."""
    if KV_INT8:
        k, v = _ptr(layer_ptrs, layer, K_PAGES, tl.int8), _ptr(layer_ptrs, layer, K_PAGES + 1, tl.int8)
    else:
        k, v = _ptr(layer_ptrs, layer, K_PAGES, act_ty), _ptr(layer_ptrs, layer, K_PAGES + 1, act_ty)
    return (k, v, _ptr(layer_ptrs, layer, K_SCALE, tl.float32), _ptr(layer_ptrs, layer, K_SCALE + 1, tl.float32),
            _ptr(layer_ptrs, layer, K_SCALE + 2, tl.float32))


@triton.jit
def _now():
    """The GPU's global timer (ns), comparable across multiprocessors."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _persistent_step_kernel(
    items_ptr, n_items, counters_ptr, n_counters, layer_ptrs, timeline_ptr,
    pos_ptr, T, causal, eps, qk_scale,
    h_ptr, qkv_ptr, q_ptr, attn_ptr, act_ptr, logits_ptr, cap_ptr, part_ptr, stat_ptr, split_ptr,
    bt_ptr, cos_ptr, sin_ptr, stride_cs, lm_w_ptr, lm_s_ptr, final_norm_ptr, w_example_ptr,
    stride_kp, stride_kh, stride_ks, stride_sp, stride_sh,
    HIDDEN: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, INTER: tl.constexpr,
    VOCAB: tl.constexpr, PAGE_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr, CHUNK: tl.constexpr,
    ATTN_BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
    BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_DOWN: tl.constexpr, BN_LM: tl.constexpr,
    INT8: tl.constexpr, LM_INT8: tl.constexpr, KV_INT8: tl.constexpr, SMOOTH: tl.constexpr,
    DOT_F32: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TIMELINE: tl.constexpr,
    STAGES: tl.constexpr, SPLIT_O: tl.constexpr, SPLIT_DOWN: tl.constexpr,
    CONVERT: tl.constexpr, ATTN_ROWS: tl.constexpr,
):
    GROUP: tl.constexpr = H // HKV
    NQKV: tl.constexpr = (H + 2 * HKV) * D
    C_ATTN: tl.constexpr = 1 + 2 * HKV
    C_GU: tl.constexpr = C_ATTN + 2  # one gate_up counter per K run of the down tiles (what each run reads)
    C_DOWN: tl.constexpr = C_GU + SPLIT_DOWN
    CPL: tl.constexpr = C_DOWN + 1
    # the K run of a down tile (gemv_item's) and the gate_up tiles of each run
    K_RUN_DOWN: tl.constexpr = (((INTER + BLOCK_K - 1) // BLOCK_K + SPLIT_DOWN - 1) // SPLIT_DOWN) * BLOCK_K
    tl.static_assert(K_RUN_DOWN % BN_GU == 0, "a gate_up tile lies in one K run of the down tiles")
    act_ty = h_ptr.dtype.element_ty
    w_ty = w_example_ptr.dtype.element_ty
    NT_O: tl.constexpr = (HIDDEN + BN_O - 1) // BN_O
    NT_DOWN: tl.constexpr = (HIDDEN + BN_DOWN - 1) // BN_DOWN
    NT_RUNS: tl.constexpr = NT_O + NT_DOWN  # a layer's tile counters of the K runs
    tiles = counters_ptr + (n_counters - 1) // (CPL + NT_RUNS) * CPL  # after the layers' own counters
    n_programs = tl.num_programs(0)
    for i in range(tl.program_id(0), n_items, n_programs):
        if TIMELINE:
            start = _now()
        kind = tl.load(items_ptr + i * 4)
        layer = tl.load(items_ptr + i * 4 + 1)
        index = tl.load(items_ptr + i * 4 + 2)
        capture = tl.load(items_ptr + i * 4 + 3)
        c = counters_ptr + layer * CPL  # this layer's counters; then every layer's split tiles' counters
        if kind == QKV:
            prev = counters_ptr + tl.maximum(layer - 1, 0) * CPL + C_DOWN  # the layer before's down
            gemv_item(h_ptr, T, _ptr(layer_ptrs, layer, 0, w_ty), _ptr(layer_ptrs, layer, 1, tl.float32),
                      _ptr(layer_ptrs, layer, 8, act_ty), eps, qkv_ptr, cap_ptr, -1, index * BN_QKV,
                      prev, tl.where(layer > 0, tl.cdiv(HIDDEN, BN_DOWN), 0),
                      HIDDEN, NQKV, 0, True, False, False, INT8, BN_QKV, BLOCK_K, DOT_F32,
                      STAGES, CONVERT=CONVERT)
            signal(c)
        elif kind == ATTN_IN:
            wait_for(c, tl.cdiv(NQKV, BN_QKV))
            k_pages, v_pages, k_scale, v_scale, smooth = _kv(layer_ptrs, layer, act_ty, KV_INT8)
            attention_inputs_item(qkv_ptr, q_ptr, k_pages, v_pages, k_scale, v_scale, smooth, bt_ptr, pos_ptr,
                                  cos_ptr, sin_ptr, stride_cs, _ptr(layer_ptrs, layer, 10, act_ty),
                                  _ptr(layer_ptrs, layer, 11, act_ty), eps, index, T, stride_kp, stride_kh,
                                  stride_ks, stride_sp, stride_sh, H, HKV, D, GROUP, ATTN_ROWS, PAGE_SIZE, KV_INT8,
                                  SMOOTH)
            signal(c + 1 + index)
        elif kind == ATTN:
            kv_head = index // NUM_SPLITS
            wait_for(c + 1 + kv_head, 1)
            k_pages, v_pages, k_scale, v_scale, smooth = _kv(layer_ptrs, layer, act_ty, KV_INT8)
            combined = attention_item(q_ptr, k_pages, v_pages, k_scale, v_scale, smooth, bt_ptr, pos_ptr, part_ptr,
                                      stat_ptr, attn_ptr, c + 1 + HKV + kv_head, T, causal, kv_head,
                                      index % NUM_SPLITS,
                                      qk_scale, stride_kp, stride_kh, stride_ks, stride_sp, stride_sh, H, HKV, D,
                                      GROUP, ATTN_ROWS, PAGE_SIZE, NUM_SPLITS, CHUNK, ATTN_BLOCK, KV_INT8, SMOOTH,
                                      UPCAST,
                                      DOT_PRECISION)
            if combined != 0:
                signal(c + C_ATTN)
        elif kind == O_PROJ:
            tile = index % NT_O
            wrote = gemv_item(attn_ptr, T, _ptr(layer_ptrs, layer, 2, w_ty), _ptr(layer_ptrs, layer, 3, tl.float32),
                              h_ptr, eps, h_ptr, cap_ptr, -1, tile * BN_O, c + C_ATTN, HKV,
                              H * D, HIDDEN, 0, False, False, True, INT8, BN_O, BLOCK_K, DOT_F32,
                              STAGES, SPLIT_O, index // NT_O, split_ptr,
                              tiles + layer * NT_RUNS + tile, CONVERT=CONVERT)
            if wrote != 0:
                signal(c + C_ATTN + 1)
        elif kind == GATE_UP:
            gemv_item(h_ptr, T, _ptr(layer_ptrs, layer, 4, w_ty), _ptr(layer_ptrs, layer, 5, tl.float32),
                      _ptr(layer_ptrs, layer, 9, act_ty), eps, act_ptr, cap_ptr, -1, index * BN_GU,
                      c + C_ATTN + 1, tl.cdiv(HIDDEN, BN_O),
                      HIDDEN, INTER, INTER, True, True, False, INT8, BN_GU, BLOCK_K, DOT_F32,
                      STAGES, CONVERT=CONVERT)
            signal(c + C_GU + index * BN_GU // K_RUN_DOWN)
        elif kind == DOWN:
            tile = index % NT_DOWN
            run = index // NT_DOWN  # waits for the gate_up tiles of its K run only
            per_run: tl.constexpr = K_RUN_DOWN // BN_GU
            run_tiles = tl.minimum((run + 1) * per_run, tl.cdiv(INTER, BN_GU)) - run * per_run
            wrote = gemv_item(act_ptr, T, _ptr(layer_ptrs, layer, 6, w_ty), _ptr(layer_ptrs, layer, 7, tl.float32),
                              h_ptr, eps, h_ptr, cap_ptr, capture, tile * BN_DOWN, c + C_GU + run,
                              run_tiles, INTER, HIDDEN, 0, False, False, True, INT8, BN_DOWN, BLOCK_K,
                              DOT_F32, STAGES, SPLIT_DOWN, index // NT_DOWN, split_ptr,
                              tiles + layer * NT_RUNS + NT_O + tile, CONVERT=CONVERT)
            if wrote != 0:
                signal(c + C_DOWN)
        else:  # LM_HEAD after the last layer
            gemv_item(h_ptr, T, lm_w_ptr, lm_s_ptr, final_norm_ptr, eps, logits_ptr, cap_ptr, -1, index * BN_LM,
                      c + C_DOWN, tl.cdiv(HIDDEN, BN_DOWN),
                      HIDDEN, VOCAB, 0, True, False, False, LM_INT8, BN_LM, BLOCK_K, DOT_F32,
                      STAGES, CONVERT=CONVERT)
        if TIMELINE:
            tl.store(timeline_ptr + i * 3, tl.program_id(0).to(tl.int64))
            tl.store(timeline_ptr + i * 3 + 1, start)
            tl.store(timeline_ptr + i * 3 + 2, _now())
    # The last program to get here zeroes every counter (the finished count too) for the next launch.
    tl.debug_barrier()
    if tl.atomic_add(counters_ptr + n_counters - 1, 1, sem="acq_rel", scope="gpu") == n_programs - 1:
        for j in range(0, n_counters, 256):
            offs = j + tl.arange(0, 256)
            tl.store(counters_ptr + offs, tl.zeros([256], tl.int32), mask=offs < n_counters)


def _items_as_calls(kernel):
    """``kernel`` with its work items (the GEMV, attention-input and attention items) compiled as
    functions it calls, not inlined: the compiler then cannot hoist one item's loop invariants out
    of the item loop, where they hold registers through every other item (what makes the inlined
    kernel take the registers of its items together). Same source, same arithmetic."""
    fn = kernel.fn
    names = dict(fn.__globals__)
    for item in (gemv_item, attention_inputs_item, attention_item):
        names[item.fn.__name__] = triton.jit(item.fn, noinline=True)
    calling = types.FunctionType(fn.__code__, names, fn.__name__, fn.__defaults__, fn.__closure__)
    calling.__annotations__ = fn.__annotations__  # the tl.constexpr marks, which the launch specializes on
    return triton.jit(calling)


_step_kernel_calling_items = _items_as_calls(_persistent_step_kernel)


def kernel_constants(shape: StepShape, *, int8: bool, lm_int8: bool, dot_f32: bool = False, upcast: bool = False,
                     timeline: bool = False, stages: int = 1,
                     int8_convert: str = "bits") -> dict:
    """The kernel's constexprs for ``shape`` (weights int8 where ``int8``, the lm_head's where
    ``lm_int8``; ``dot_f32``, ``upcast``: the interpreter's float32 tiles, whose int8 weights take
    Triton's cast; else ``int8_convert`` of linear_tiles.INT8_CONVERTS)."""
    s = shape
    return dict(HIDDEN=s.hidden, H=s.heads, HKV=s.kv_heads, D=s.head_dim, INTER=s.intermediate, VOCAB=s.vocab,
                PAGE_SIZE=s.page_size, NUM_SPLITS=s.num_splits, CHUNK=s.chunk, ATTN_BLOCK=s.attn_block,
                BLOCK_K=s.block_k, BN_QKV=s.block_n[0], BN_O=s.block_n[1], BN_GU=s.block_n[2], BN_DOWN=s.block_n[3],
                BN_LM=s.block_n[4], INT8=int8, LM_INT8=lm_int8, KV_INT8=s.kv_int8, SMOOTH=s.kv_int8 and s.k_smooth,
                DOT_F32=dot_f32, UPCAST=upcast, DOT_PRECISION="ieee", TIMELINE=timeline, STAGES=stages,
                SPLIT_O=s.k_splits()[0], SPLIT_DOWN=s.k_splits()[1],
                CONVERT=0 if dot_f32 else INT8_CONVERTS[int8_convert],
                ATTN_ROWS=s.attention_rows)


def compile_options(num_warps: int, max_registers: int) -> dict:
    """The compiler options of a launch (FMA contraction off: see :func:`launch_persistent_step`)."""
    return dict(num_warps=num_warps, num_stages=1, maxnreg=max_registers or None, enable_fp_fusion=False)


def launch_persistent_step(plan: StepPlan, shape: StepShape, bufs: StepBuffers, layer_ptrs: torch.Tensor,
                           positions: torch.Tensor, block_table: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           lm_w: torch.Tensor, lm_s: torch.Tensor | None, final_norm: torch.Tensor,
                           layer_weight: torch.Tensor, page_strides: tuple[int, int, int], eps: float,
                           programs: int, dot_f32: bool, *, scale_strides: tuple[int, int] = (0, 0),
                           num_warps: int = 4, max_registers: int = 0, timeline: torch.Tensor | None = None,
                           causal: bool = True, stages: int = 1, item_calls: bool = False,
                           int8_convert: str = "bits", warmup: bool = False):
    """One step of ``T = positions.numel()`` (1..16) tokens whose embeddings are in ``bufs.h[:T]``:
    runs ``plan`` and leaves the float32 logits in ``bufs.logits[:T]``, the captured layer outputs
    in ``bufs.capture``, the keys and values in the pages. ``layer_ptrs``: the layers' addresses
    (persistent_plan.LAYER_POINTERS; weights in ``layer_weight``'s dtype, int8 with float32 row
    scales or the model dtype; pages with ``page_strides`` (page, head, slot) alike for K and V, in
    the model dtype, or int8 where ``shape.kv_int8`` with float32 scales ``[P, Hkv, page_size]`` of
    ``scale_strides`` (page, head; slots contiguous) alike for K and V, the keys divided by the
    float32 ``[D]`` smoothing where ``shape.k_smooth``). ``lm_w`` (``lm_s`` its scales where int8)
    and ``final_norm``: the lm_head's. ``dot_f32``: the interpreter (float32 tiles). ``num_warps``: warps a
    program; ``max_registers``: the compiler's cap of registers a thread (``maxnreg``: it spills above), 0 for
    its own choice (up to 255). ``causal`` False: every query also sees the keys of the step's later
    tokens (a block drafter's step). ``stages``, ``int8_convert``: how the GEMV items load and
    convert their chunks
    (:func:`persistent_items.gemv_item`; the same bits). ``item_calls``: the kernel whose work items
    are calls, not inlined (:func:`_items_as_calls`). ``timeline``: int64 ``[n_items, 3]``, where
    each item's program, start and end (ns of the GPU's global timer) are written (profiling; None:
    not). ``warmup``: compile, do not run; returns the compiled kernel (for
    :func:`resident_programs`). FMA contraction is off: the 1-token step (T compiled as a constant)
    and the others round alike."""
    t = positions.numel()
    assert 1 <= t <= 16, f"the persistent step runs 1..16 tokens, got {t}"
    s, act = shape, bufs.h
    int8, lm_int8 = layer_weight.dtype == torch.int8, lm_w.dtype == torch.int8
    dummy = bufs.stat
    args = (plan.items, plan.items.shape[0], bufs.counters, bufs.counters.numel(), layer_ptrs,
            bufs.counters if timeline is None else timeline,
            positions, t, int(causal), eps, s.head_dim ** -0.5 * 1.4426950408889634,
            act, bufs.qkv, bufs.q, bufs.attn, bufs.act, bufs.logits, bufs.capture, bufs.part, bufs.stat, bufs.split,
            block_table, cos, sin, cos.stride(0), lm_w, lm_s if lm_int8 else dummy, final_norm, layer_weight,
            *page_strides, *scale_strides)
    kw = dict(kernel_constants(s, int8=int8, lm_int8=lm_int8, dot_f32=dot_f32,
                               upcast=dot_f32 and act.dtype != torch.float32, timeline=timeline is not None,
                               stages=stages, int8_convert=int8_convert),
              **compile_options(num_warps, max_registers))
    kernel = step_kernel(item_calls)
    if warmup:
        return kernel.warmup(*args, grid=(programs,), **kw)
    kernel[(programs,)](*args, **kw)
    return None


def step_kernel(item_calls: bool = False):
    """The step's kernel: its work items inlined, or (``item_calls``) called (:func:`_items_as_calls`)."""
    return _step_kernel_calling_items if item_calls else _persistent_step_kernel
