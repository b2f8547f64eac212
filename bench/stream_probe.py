"""How fast a persistent grid can stream a decoder's weights through 16-token GEMV tiles, by the way
each program gets its weight chunks, with nothing else in the kernel: no waits between items, no
norms, no attention. ``python -m bench stream-probe [--shape S] [--layers N] [--mode M ...]``.

It bounds the persistent step (backends/triton/persistent.py), whose GEMV items stream one chunk
of 16 x 256 weights about every 1.05 us a program (its timeline): is that the loading scheme's own
rate, or what the step's waits add? Each mode is one kernel over the same work list, the tiles of
``--layers`` layers' qkv, o_proj, gate_up and down weights in layer order, ``y[16, N] = x W^T`` for
each weight, on a grid of ``programs_per_sm`` x the SMs (the most that fit where not given):

- ``registers``: 16-column tiles, each chunk's successor loaded into registers before the chunk's
  dot (the persistent step's default, ``stages=1``);
- ``pipeline``: 16-column tiles through the compiler's pipeline of ``--stages`` stages (cp.async
  into shared memory; the step's ``stages``);
- ``tma``: as ``pipeline``, the weight chunks through tensor descriptors made on the device (one
  thread's bulk copies);
- ``tma_t``: 64-row weight tiles computed transposed (``acc[64, 16] = W x^T``: the weights as the
  tensor cores' M side, so that sm_90 runs them as warpgroup MMAs), weights and x through
  descriptors, pipelined;
- ``ws``: ``tma_t`` with the chunk loop warp-specialized (``tl.range(warp_specialize=True)``: a
  producer warp group issues the copies into a ring of stages while the others compute; Triton
  3.6 does this on sm_90 for warpgroup MMAs at ``num_warps`` 4, which become 12 warps).

Every mode computes the same products over the same chunks in the same order (the tests compare
them with ``x W^T`` under the interpreter). Figures: GB/s of weight bytes over the median time of
a launch (CUDA events, after a warm-up) and their fraction of the copy bandwidth measured in the
same run; records kind ``stream_probe``.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from . import records
from .shapes import model_config
from .timing import copy_bandwidth, median_seconds

MODES = ("registers", "pipeline", "tma", "tma_t", "ws")
FIELDS = tl.constexpr(5)  # a work item: weight address, K, weight rows N, first row n0, offset of the weight's y


@triton.jit
def _stream_kernel(items_ptr, n_items, x_ptr, y_ptr, KMAX, MODE: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, STAGES: tl.constexpr):
    offs_t = tl.arange(0, 16)
    offs_k = tl.arange(0, BK)
    for i in range(tl.program_id(0), n_items, tl.num_programs(0)):
        w_ptr = tl.multiple_of(tl.load(items_ptr + i * FIELDS).to(tl.pointer_type(x_ptr.dtype.element_ty)), 16)
        K = tl.multiple_of(tl.load(items_ptr + i * FIELDS + 1).to(tl.int32), 8)  # rows of 16 bytes: vector loads
        N = tl.load(items_ptr + i * FIELDS + 2).to(tl.int32)
        n0 = tl.load(items_ptr + i * FIELDS + 3).to(tl.int32)
        y_at = y_ptr + tl.load(items_ptr + i * FIELDS + 4)
        offs_n = n0 + tl.arange(0, BN)
        n_ok = offs_n < N
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]
        x_rows = x_ptr + offs_t[:, None] * KMAX + offs_k[None, :]
        if MODE == 0 or MODE == 1 or MODE == 2:
            acc = tl.zeros([16, BN], tl.float32)
            if MODE == 0:
                w = tl.load(w_rows, mask=n_ok[:, None] & (offs_k < K)[None, :], other=0.0)
                for k0 in range(0, K, BK):
                    k_ok = (k0 + BK + offs_k < K)[None, :]
                    w_next = tl.load(w_rows + k0 + BK, mask=n_ok[:, None] & k_ok, other=0.0)
                    x = tl.load(x_rows + k0, mask=(k0 + offs_k < K)[None, :], other=0.0)
                    acc = tl.dot(x, tl.trans(w), acc)
                    w = w_next
            else:
                if MODE == 2:
                    w_desc = tl.make_tensor_descriptor(w_ptr, [N, K], [K, 1], [BN, BK])
                for k0 in tl.range(0, K, BK, num_stages=STAGES):
                    if MODE == 2:
                        w = w_desc.load([n0, k0])
                    else:
                        w = tl.load(w_rows + k0, mask=n_ok[:, None] & (k0 + offs_k < K)[None, :], other=0.0)
                    x = tl.load(x_rows + k0, mask=(k0 + offs_k < K)[None, :], other=0.0)
                    acc = tl.dot(x, tl.trans(w), acc)
            tl.store(y_at + offs_t[:, None] * N + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                     mask=n_ok[None, :])
        else:
            w_desc = tl.make_tensor_descriptor(w_ptr, [N, K], [K, 1], [BN, BK])
            x_desc = tl.make_tensor_descriptor(x_ptr, [16, K], [KMAX, 1], [16, BK])
            acc = tl.zeros([BN, 16], tl.float32)
            for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES, warp_specialize=MODE == 4):
                w = w_desc.load([n0, k * BK])
                x = x_desc.load([0, k * BK])
                acc = tl.dot(w, tl.trans(x), acc)
            tl.store(y_at + offs_t[None, :] * N + offs_n[:, None], acc.to(y_ptr.dtype.element_ty),
                     mask=n_ok[:, None])


def layer_weights(shape: str, layers: int, device, dtype=torch.bfloat16, seed: int = 0) -> list[torch.Tensor]:
    """``layers`` x (qkv, o_proj, gate_up, down) random weights of the model ``shape`` in layer order."""
    c = model_config(shape)
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = [((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, c.hidden_size),
            (c.hidden_size, c.num_heads * c.head_dim), (2 * c.intermediate_size, c.hidden_size),
            (c.hidden_size, c.intermediate_size)]
    return [(torch.randn(n, k, generator=g) * 0.02).to(device=device, dtype=dtype)
            for _ in range(layers) for n, k in rows]


def work_items(weights: list[torch.Tensor], block_n: int) -> tuple[torch.Tensor, int]:
    """The int64 work list ``[items, FIELDS]`` (each weight's row tiles in order) and y's elements."""
    rows, at = [], 0
    for w in weights:
        n, k = w.shape
        assert w.is_contiguous() and w.data_ptr() % 16 == 0 and (k * w.element_size()) % 16 == 0, "TMA-able weights"
        rows += [[w.data_ptr(), k, n, n0, at] for n0 in range(0, n, block_n)]
        at += 16 * n
    return torch.tensor(rows, dtype=torch.int64, device=weights[0].device), at


MODE_TILES = {"registers": (0, 16), "pipeline": (1, 16), "tma": (2, 16), "tma_t": (3, 64), "ws": (4, 64)}


class Probe:
    """One mode's launch over ``weights`` (``[N, K]``) and ``x`` (``[16, KMAX]``), its work list and
    output (flat: each weight's ``[16, N]`` in order) made once, so that a launch is the kernel alone."""

    def __init__(self, mode: str, weights: list[torch.Tensor], x: torch.Tensor, *, block_k: int = 256,
                 stages: int = 3) -> None:
        code, block_n = MODE_TILES[mode]
        self.items, size = work_items(weights, block_n)
        self.x = x
        self.y = torch.full((size,), float("nan"), dtype=x.dtype, device=x.device)
        self.kw = dict(MODE=code, BN=block_n, BK=block_k, STAGES=stages if code else 1, num_warps=4, num_stages=1)
        self.scratch: list[torch.Tensor] = []

    def _scratch(self, size: int, alignment: int, stream) -> torch.Tensor:
        if not self.scratch or self.scratch[-1].numel() < size:
            self.scratch.append(torch.empty(size, dtype=torch.int8, device=self.x.device))
        return self.scratch[-1]

    def __call__(self, programs: int, warmup: bool = False):
        """``y`` after one launch of ``programs`` programs; ``warmup``: compile only, the compiled kernel."""
        triton.set_allocator(self._scratch)  # the descriptors made on the device live in global scratch
        args = (self.items, self.items.shape[0], self.x, self.y, self.x.shape[1])
        if warmup:
            return _stream_kernel.warmup(*args, grid=(programs,), **self.kw)
        _stream_kernel[(programs,)](*args, **self.kw)
        return self.y


def reference(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The twin: each ``x[:, :K] W^T`` in float32, flattened in order."""
    return torch.cat([(x[:, :w.shape[1]].float() @ w.float().T).flatten() for w in weights])


def arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("--shape", action="append", help="model shape of bench/shapes.py (repeatable; default Qwen3-4B "
                   "and Qwen3-0.6B)")
    p.add_argument("--layers", type=int, default=4, help="layers of weights streamed (default 4: past the L2)")
    p.add_argument("--mode", action="append", choices=MODES, help=f"loading scheme (repeatable; default all: "
                   f"{', '.join(MODES)})")
    p.add_argument("--stages", type=int, default=3, help="pipeline stages of the pipelined modes (default 3)")
    p.add_argument("--programs-per-sm", type=int, default=0, help="programs a multiprocessor (default: the most "
                   "that fit)")
    p.add_argument("--repeats", type=int, default=20)
    records.arguments(p)


def main(args) -> int:
    from tileinfer.backends.triton.persistent_plan import resident_programs

    if not torch.cuda.is_available():
        print("error: python -m bench stream-probe needs a CUDA GPU (none is visible)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    bandwidth = copy_bandwidth(device)
    run = records.Run(device, commit=args.commit, path=args.records)
    print(f"{props.name}: copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"{'shape':<12} {'mode':<10} {'programs':>8} {'us':>9} {'GB/s':>7} {'of copy':>8} {'max err':>8}")
    for shape in args.shape or ["Qwen3-4B", "Qwen3-0.6B"]:
        weights = layer_weights(shape, args.layers, device)
        x = torch.randn(16, max(w.shape[1] for w in weights), device=device, dtype=torch.bfloat16)
        moved = sum(w.numel() * w.element_size() for w in weights)
        ref = reference(weights, x)
        for mode in args.mode or MODES:
            probe = Probe(mode, weights, x, stages=args.stages)
            compiled = probe(props.multi_processor_count, warmup=True)
            fit = resident_programs(compiled, props.multi_processor_count, props.shared_memory_per_multiprocessor)
            programs = props.multi_processor_count * min(args.programs_per_sm or fit, fit)
            err = (probe(programs).float() - ref).abs().max().item()
            seconds = median_seconds(lambda: probe(programs), device, repeats=args.repeats)
            print(f"{shape:<12} {mode:<10} {programs:>8} {seconds * 1e6:>9.1f} {moved / seconds / 1e9:>7.0f} "
                  f"{moved / seconds / bandwidth:>8.1%} {err:>8.1e}")
            run.add("stream_probe", shape=shape, mode=mode, layers=args.layers, stages=args.stages,
                    programs=programs, warps=compiled.metadata.num_warps, seconds=seconds, bytes=moved,
                    copy_bandwidth=bandwidth, max_error=err)
    return 0
