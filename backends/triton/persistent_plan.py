"""Host side of the persistent decode step (persistent.py): the shapes a compiled kernel
serves (:class:`StepShape`, its GEMV tiles from :func:`block_n_sizes` and :func:`qkv_block_n`), the
work list of a step (:class:`StepPlan`), the buffers it works in (:class:`StepBuffers`) and the grid
that fits on the device (:func:`resident_programs`)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import triton

from tileinfer.backends.triton.persistent_items import BLOCK_T

# Item kinds, in the order of a layer's work.
QKV, ATTN_IN, ATTN, O_PROJ, GATE_UP, DOWN, LM_HEAD = range(7)
KIND_NAMES = ("qkv", "attn_inputs", "attention", "o_proj", "gate_up", "down", "lm_head")
# The addresses each layer hands the kernel: one int64 row of ``layer_ptrs`` per layer. The last
# three go with int8 pages: the float32 K and V scales and the key smoothing.
LAYER_POINTERS = ("qkv_w", "qkv_s", "o_w", "o_s", "gate_up_w", "gate_up_s", "down_w", "down_s",
                  "input_norm", "post_norm", "q_norm", "k_norm", "k_pages", "v_pages", "k_scale", "v_scale",
                  "k_smooth")
INT8_KV_POINTERS = ("k_scale", "v_scale", "k_smooth")
NUM_PTRS = len(LAYER_POINTERS)
ALIGN = 16  # bytes: every address of the table (the kernel reads through it in 16-byte vectors)
BLOCK_N = "auto,16,16,16,64"  # options.persistent.block_n's default: qkv by qkv_block_n, the others fixed


def block_n_sizes(text: str) -> tuple[int | None, int, int, int, int]:
    """The GEMV tiles' output columns that ``text`` names (``options.persistent.block_n``): qkv,
    o_proj, gate_up, down, lm_head, comma-separated powers of two >= 16; qkv's may be ``auto``
    (None here: :func:`qkv_block_n` decides). A ValueError of one line for anything else."""
    parts = [p.strip() for p in text.split(",")]
    sizes = [None if i == 0 and p == "auto" else int(p) if p.isdigit() else 0 for i, p in enumerate(parts)]
    if len(sizes) != 5 or any(b is not None and (b < 16 or b & (b - 1)) for b in sizes):
        raise ValueError(f"block_n={text!r}: five powers of two >= 16, comma-separated (qkv's may be auto)")
    return tuple(sizes)


def qkv_block_n(columns: int, programs: int) -> int:
    """The qkv tile's output columns for ``columns`` qkv columns over a grid of ``programs``: 16,
    unless tiles of 16 take more than one round of the programs, then 32. Qwen3-4B (6,144 columns:
    384 tiles of 16, two rounds of 264 programs; 192 of 32, one) took 4.39 ms a 1-token step with
    32, 4.73 with 16 (an H100, 2026-12-06); Qwen3-0.6B's 4,096 columns are 256 tiles of 16, one round."""
    return 16 if triton.cdiv(columns, 16) <= programs else 32


@dataclass(frozen=True)
class StepShape:
    """The model shapes and the tiles of one compiled persistent kernel."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layers: int
    page_size: int
    num_splits: int = 16  # attention partitions per kv head
    chunk: int = 128  # positions per attention chunk (a multiple of attn_block)
    attn_block: int = 64  # keys per attention tile
    block_k: int = 256
    block_n: tuple[int, int, int, int, int] = (16, 16, 16, 16, 64)  # qkv, o_proj, gate_up, down, lm_head
    split_k: int = 1  # K runs of the o_proj and down tiles (at most: no run left empty)
    kv_int8: bool = False  # int8 pages with float32 scales per vector (kv_store=paged_int8)
    k_smooth: bool = False  # with kv_int8: the keys are divided by a per-layer smoothing

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def attention_rows(self) -> int:
        """Query rows of an attention tile: 16 tokens x ``group`` heads, padded to a power of two
        (the rows past ``16 * group`` are masked)."""
        return triton.next_power_of_2(BLOCK_T.value * self.group)

    @property
    def qkv_rows(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def tiles(self) -> tuple[int, int, int, int, int]:
        """GEMV tiles of qkv, o_proj, gate_up (counted in output columns), down, lm_head."""
        outs = (self.qkv_rows, self.hidden, self.intermediate, self.hidden, self.vocab)
        return tuple(triton.cdiv(n, b) for n, b in zip(outs, self.block_n))

    def k_splits(self) -> tuple[int, int]:
        """The K runs of an o_proj and a down tile: ``split_k``, fewer where a run would be empty."""
        def runs(k: int) -> int:
            chunks = triton.cdiv(k, self.block_k)
            return triton.cdiv(chunks, triton.cdiv(chunks, min(self.split_k, chunks)))
        return runs(self.heads * self.head_dim), runs(self.intermediate)

    @property
    def num_counters(self) -> int:
        """Per layer: qkv, attention inputs and splits per kv head, attention, o_proj, gate_up (one
        per K run of the down tiles: the gate_up tiles each run reads), down; then per layer the
        runs finished of each o_proj and down tile; then the count of finished programs."""
        _, n_o, _, n_down, _ = self.tiles()
        return self.layers * (4 + 2 * self.kv_heads + self.k_splits()[1]) + self.layers * (n_o + n_down) + 1


@dataclass
class StepPlan:
    """The work list of one step: ``items`` int32 ``[n, 4]`` (kind, layer, index, capture slot or
    -1), with the lm_head tiles (``logits``) or without, and the layers whose output is captured
    (slot = rank in ``capture``)."""

    items: torch.Tensor
    capture: tuple[int, ...]

    @classmethod
    def build(cls, shape: StepShape, device: torch.device, *, logits: bool = True,
              capture: tuple[int, ...] = ()) -> "StepPlan":
        n_qkv, n_o, n_gu, n_down, n_lm = shape.tiles()
        rows: list[tuple[int, int, int, int]] = []
        for layer in range(shape.layers):
            rows += [(QKV, layer, i, -1) for i in range(n_qkv)]
            rows += [(ATTN_IN, layer, g, -1) for g in range(shape.kv_heads)]
            rows += [(ATTN, layer, g * shape.num_splits + s, -1)
                     for s in range(shape.num_splits) for g in range(shape.kv_heads)]
            split_o, split_down = shape.k_splits()
            rows += [(O_PROJ, layer, i, -1) for i in range(n_o * split_o)]  # run i // n_o of tile i % n_o
            rows += [(GATE_UP, layer, i, -1) for i in range(n_gu)]
            slot = capture.index(layer) if layer in capture else -1
            rows += [(DOWN, layer, i, slot) for i in range(n_down * split_down)]
        if logits:
            rows += [(LM_HEAD, shape.layers - 1, i, -1) for i in range(n_lm)]
        return cls(torch.tensor(rows, dtype=torch.int32, device=device), tuple(capture))


@dataclass
class StepBuffers:
    """Everything the kernel writes, sized for 16 token rows: the residual stream ``h``, the qkv
    projection, the rotated q heads, the attention output, the SwiGLU activations, float32 logits,
    captured layer outputs, the attention partials and statistics, the split K runs' partial sums,
    the counters (zero between launches)."""

    h: torch.Tensor
    qkv: torch.Tensor
    q: torch.Tensor
    attn: torch.Tensor
    act: torch.Tensor
    logits: torch.Tensor
    capture: torch.Tensor
    part: torch.Tensor
    stat: torch.Tensor
    split: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def allocate(cls, shape: StepShape, dtype: torch.dtype, device: torch.device, captures: int) -> "StepBuffers":
        s, rows = shape, BLOCK_T.value
        partials = s.kv_heads * s.num_splits * s.attention_rows

        def zeros(*size, dt=dtype):
            return torch.zeros(size, dtype=dt, device=device)

        return cls(h=zeros(rows, s.hidden), qkv=zeros(rows, s.qkv_rows), q=zeros(rows, s.heads * s.head_dim),
                   attn=zeros(rows, s.heads * s.head_dim), act=zeros(rows, s.intermediate),
                   logits=zeros(rows, s.vocab, dt=torch.float32), capture=zeros(max(captures, 1), rows, s.hidden),
                   part=zeros(partials * s.head_dim, dt=torch.float32), stat=zeros(2 * partials, dt=torch.float32),
                   split=zeros(max(s.k_splits()), rows, s.hidden, dt=torch.float32),
                   counters=zeros(s.num_counters, dt=torch.int32))

    def poison(self) -> None:
        """NaN in every float buffer (tests: nothing may be read before it is written)."""
        for f in fields(self):
            t = getattr(self, f.name)
            if t.is_floating_point():
                t.fill_(float("nan"))


def layer_pointer_table(rows: list[dict[str, torch.Tensor | None]], device: torch.device) -> torch.Tensor:
    """int64 ``[layers, NUM_PTRS]`` of the tensors' addresses, in ``LAYER_POINTERS`` order (the
    tensors must stay alive as long as the table is used). The int8 pages' entries
    (``INT8_KV_POINTERS``) may be absent or None: the K pages' address stands in (never read).
    Every address must be 16-byte aligned (the kernel loads through them in 16-byte vectors): a
    ValueError names the first that is not."""
    def address(row: dict, name: str) -> int:
        t = row.get(name) if name in INT8_KV_POINTERS else row[name]
        ptr = (row["k_pages"] if t is None else t).data_ptr()
        if ptr % ALIGN:
            raise ValueError(f"{name} at {ptr:#x} is not {ALIGN}-byte aligned")
        return ptr

    table = [[address(row, name) for name in LAYER_POINTERS] for row in rows]
    return torch.tensor(table, dtype=torch.int64, device=device)


def resident_programs(compiled, num_sms: int, shared_per_sm: int, regs_per_sm: int = 65536,
                      max_per_sm: int = 32, threads_per_sm: int = 2048, reg_unit: int = 8,
                      shared_reserved: int = 1024) -> int:
    """Programs per multiprocessor of a compiled kernel that can be resident at once (registers,
    shared memory, threads, the hardware limit): a persistent grid larger than ``num_sms`` times
    this would wait on programs that never start. Registers are allocated per warp in units of
    256 (``reg_unit`` 8 a thread: 100 registers take 104), and each program's shared memory takes
    ``shared_reserved`` bytes more (sm_80 and later)."""
    compiled._init_handles()  # loads the module: fills in n_regs
    threads = compiled.metadata.num_warps * 32
    regs = -(-compiled.n_regs // reg_unit) * reg_unit
    by_regs = regs_per_sm // max(regs * threads, 1)
    shared = compiled.metadata.shared
    by_shared = shared_per_sm // (shared + shared_reserved) if shared else max_per_sm
    return max(0, min(by_regs, by_shared, threads_per_sm // threads, max_per_sm))
