"""Programmatic dependent launch (backends/triton/pdl.py) in every launcher of the decode path:
``pdl=True`` must give the bits of ``pdl=False``.

On the GPU (Qwen3-4B shapes, bfloat16) each launcher runs eagerly both ways, then from a CUDA graph
in which a PDL-launched Triton kernel first rewrites every input that an earlier kernel could have
produced (activations, pages; positions and the block table by a torch copy), and a PDL-launched
kernel after it copies each output: the launcher must wait for the kernel before it, and the one
after must see its finished outputs. The inputs are zeroed and the outputs reset before each
replay. A whole two-layer decode chain (norms, GEMVs, attention inputs, split-KV attention) is
checked the same way, fused and as the chain of per-op kernels. Without a GPU only the rule of
when PDL is granted is checked (nowhere there).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch

from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.attention_inputs import attention_inputs, k_norm_rope_write, q_norm_rope
from tileinfer.backends.triton.kv_write import write_kv, write_pages
from tileinfer.backends.triton.linear import linear
from tileinfer.backends.triton.paged_attention import paged_decode_attention, paged_prefill_attention
from tileinfer.backends.reference.kv_quant import key_smoothing, write_quantized
from tileinfer.backends.reference.paged_attention import gather_pages
from tileinfer.backends.triton.pdl import launch_options, pdl_supported, use_pdl
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.backends.triton.rope import apply_rope
from tileinfer.backends.triton.silu_mul import silu_mul
from tileinfer.model import rope_table

from ..kernel_checks import DEVICE, EPS, THETA, generator, norm_weight, poisoned, randn
from .per_op_chains import inputs_per_op, linear_fused, linear_per_op


@dataclass(frozen=True)
class Shapes:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    page: int
    start: int  # decode: the step's first position
    dtype: torch.dtype


QWEN3_4B = Shapes(2560, 32, 8, 128, 9728, 64, 1000, torch.bfloat16)


@dataclass
class Case:
    """``launch(pdl)`` reads ``inputs`` (and immutable weights) and writes ``outputs``; before each
    run every output is reset to its entry of ``backgrounds`` (NaN where the launch writes all of
    it; random values for pages, of which it writes a few slots)."""

    launch: Callable[[bool], None]
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    backgrounds: list[torch.Tensor] = field(default_factory=list)

    def reset(self) -> None:
        for out, bg in zip(self.outputs, self.backgrounds or [None] * len(self.outputs)):
            if bg is None:
                out.fill_(float("nan"))
            else:
                out.copy_(bg)


class Step:
    """Random tensors of one step: qkv, norm weights, rope tables, positions, pages holding the
    positions before the step, a permuted block table."""

    def __init__(self, s: Shapes, t: int, key, group: int | None = None):
        g = generator("step", *key)
        self.s, self.t = s, t
        self.heads = s.heads if group is None else s.kv_heads * group
        d = s.head_dim
        self.qkv = randn((t, (self.heads + 2 * s.kv_heads) * d), s.dtype, g, 2.0)
        self.q_w, self.k_w = norm_weight(d, s.dtype, g), norm_weight(d, s.dtype, g)
        length = s.start + t
        num_pages = -(-length // s.page) + 2
        self.table = rope_table(d, THETA, num_pages * s.page, torch.device(DEVICE))
        self.positions = torch.arange(s.start, length, device=DEVICE)
        self.block_table = torch.randperm(num_pages, generator=g, device=DEVICE).to(torch.int32)
        self.k_pages = randn((num_pages, s.kv_heads, s.page, d), s.dtype, g)
        self.v_pages = randn((num_pages, s.kv_heads, s.page, d), s.dtype, g)
        self.q = randn((t, self.heads, d), s.dtype, g)

    def attention_args(self):
        s = self.s
        return (self.q_w, self.k_w, self.table.cos, self.table.sin, self.positions, self.k_pages, self.v_pages,
                self.block_table, self.heads, s.kv_heads, s.head_dim, EPS)


# -- the launchers -----------------------------------------------------------------------------------


def case_rms_norm_rows(s: Shapes, t: int) -> Case:
    g = generator("rows", t)
    x, w = randn((t, s.hidden), s.dtype, g, 3.0), norm_weight(s.hidden, s.dtype, g)
    out = poisoned((t, s.hidden), s.dtype)
    return Case(lambda pdl: rms_norm(x, w, EPS, out=out, pdl=pdl), [x], [out])


def case_rms_norm_heads(s: Shapes, t: int) -> Case:
    g = generator("heads", t)
    x = randn((t, s.heads, s.head_dim), s.dtype, g, 3.0)
    w = norm_weight(s.head_dim, s.dtype, g)
    out = poisoned(x.shape, s.dtype)
    return Case(lambda pdl: rms_norm(x, w, EPS, out=out, pdl=pdl), [x], [out])


def case_add(s: Shapes, t: int) -> Case:
    g = generator("add", t)
    x, r = randn((t, s.hidden), s.dtype, g), randn((t, s.hidden), s.dtype, g)
    out = poisoned(x.shape, s.dtype)
    return Case(lambda pdl: add(x, r, out=out, pdl=pdl), [x, r], [out])


def case_linear_residual(s: Shapes, t: int) -> Case:
    """The fused GEMV of the decoder's residual stream: residual epilogue."""
    g = generator("linear_residual", t)
    x, r = randn((t, s.hidden), s.dtype, g, 3.0), randn((t, s.hidden), s.dtype, g)
    w = randn((s.hidden, s.hidden), s.dtype, g, s.hidden ** -0.5)
    out = poisoned(x.shape, s.dtype)
    return Case(lambda pdl: linear(x, w, residual=r, out=out, pdl=pdl), [x, r], [out])


def case_apply_rope(s: Shapes, t: int) -> Case:
    st = Step(s, t, ("rope", t))
    out = poisoned(st.q.shape, s.dtype)
    return Case(lambda pdl: apply_rope(st.q, st.table.cos, st.table.sin, st.positions, out=out, pdl=pdl),
                [st.q, st.positions], [out])


def case_write_kv(s: Shapes, t: int) -> Case:
    st = Step(s, t, ("write_kv", t))
    g = generator("write_kv-values", t)
    k, v = (randn((t, s.kv_heads, s.head_dim), s.dtype, g) for _ in range(2))
    bgs = [st.k_pages.clone(), st.v_pages.clone()]
    return Case(lambda pdl: write_kv(st.k_pages, st.v_pages, st.block_table, st.positions, k, v, pdl=pdl),
                [k, v, st.positions, st.block_table], [st.k_pages, st.v_pages], bgs)


def case_write_pages(s: Shapes, t: int) -> Case:
    st = Step(s, t, ("write_pages", t))
    x = randn((t, s.kv_heads, s.head_dim), s.dtype, generator("write_pages-values", t))
    return Case(lambda pdl: write_pages(st.k_pages, st.block_table, st.positions, x, pdl=pdl),
                [x, st.positions, st.block_table], [st.k_pages], [st.k_pages.clone()])


def case_silu_mul(s: Shapes, t: int) -> Case:
    gate_up = randn((t, 2 * s.inter), s.dtype, generator("silu", t), 3.0)
    out = poisoned((t, s.inter), s.dtype)
    return Case(lambda pdl: silu_mul(gate_up, out=out, pdl=pdl), [gate_up], [out])


def case_q_norm_rope(s: Shapes, t: int) -> Case:
    st = Step(s, t, ("q_norm_rope", t))
    out = poisoned((t, st.heads, s.head_dim), s.dtype)
    return Case(lambda pdl: q_norm_rope(st.qkv, st.q_w, st.table.cos, st.table.sin, st.positions, st.heads,
                                        s.kv_heads, s.head_dim, EPS, out=out, pdl=pdl),
                [st.qkv, st.positions], [out])


def case_k_norm_rope_write(s: Shapes, t: int) -> Case:
    st = Step(s, t, ("k_norm_rope_write", t))
    return Case(lambda pdl: k_norm_rope_write(st.qkv, st.k_w, st.table.cos, st.table.sin, st.positions,
                                              st.k_pages, st.v_pages, st.block_table, st.heads, s.kv_heads,
                                              s.head_dim, EPS, pdl=pdl),
                [st.qkv, st.positions, st.block_table], [st.k_pages, st.v_pages],
                [st.k_pages.clone(), st.v_pages.clone()])


def _inputs_case(fn, s: Shapes, t: int) -> Case:
    st = Step(s, t, (fn.__name__, t))
    q = poisoned((t, st.heads, s.head_dim), s.dtype)
    return Case(lambda pdl: q.copy_(fn(st.qkv, *st.attention_args(), pdl=pdl)),
                [st.qkv, st.positions, st.block_table], [q, st.k_pages, st.v_pages],
                [None, st.k_pages.clone(), st.v_pages.clone()])


def case_attention_inputs(s: Shapes, t: int) -> Case:
    return _inputs_case(attention_inputs, s, t)


def case_inputs_per_op(s: Shapes, t: int) -> Case:
    return _inputs_case(inputs_per_op, s, t)


def _decode_case(s: Shapes, t: int, group: int, splits: int) -> Case:
    st = Step(s, t, ("decode", t, group, splits), group=group)
    out = poisoned(st.q.shape, s.dtype)
    scale = s.head_dim ** -0.5
    return Case(lambda pdl: paged_decode_attention(st.q, st.k_pages, st.v_pages, st.block_table, s.start, scale,
                                                   positions=st.positions, num_splits=splits, out=out, pdl=pdl),
                [st.q, st.k_pages, st.v_pages, st.positions, st.block_table], [out])


def case_decode_g4_splits(s: Shapes, t: int) -> Case:
    return _decode_case(s, t, 4, 16)


def case_decode_g1_one_split(s: Shapes, t: int) -> Case:
    return _decode_case(s, t, 1, 1)


def case_decode_int8(s: Shapes, t: int) -> Case:
    """The decode kernels over int8 pages with their scales and the key smoothing (paged_int8)."""
    st = Step(s, t, ("decode_int8", t), group=4)
    k8, v8 = torch.empty_like(st.k_pages, dtype=torch.int8), torch.empty_like(st.v_pages, dtype=torch.int8)
    k_scale, v_scale = (torch.empty(k8.shape[:-1], dtype=torch.float32, device=DEVICE) for _ in range(2))
    smooth = key_smoothing(norm_weight(s.head_dim, torch.float32, generator("decode_int8-smooth", t)))
    every = torch.arange(k8.shape[0] * s.page, device=DEVICE)
    dense = [gather_pages(p, st.block_table, every.numel()) for p in (st.k_pages, st.v_pages)]
    write_quantized(k8, v8, k_scale, v_scale, st.block_table, every, *dense, smooth)
    out = poisoned(st.q.shape, s.dtype)
    return Case(lambda pdl: paged_decode_attention(st.q, k8, v8, st.block_table, s.start, s.head_dim ** -0.5,
                                                   positions=st.positions, num_splits=16, k_scale=k_scale,
                                                   v_scale=v_scale, k_smooth=smooth, out=out, pdl=pdl),
                [st.q, k8, v8, k_scale, v_scale, st.positions, st.block_table], [out])


def case_prefill(s: Shapes, t: int) -> Case:
    t = t * 4 + 17  # a prefill-sized step (1 -> 21, 16 -> 81 tokens)
    st = Step(s, t, ("prefill", t))
    out = poisoned(st.q.shape, s.dtype)
    return Case(lambda pdl: paged_prefill_attention(st.q, st.k_pages, st.v_pages, st.block_table, s.start,
                                                    s.head_dim ** -0.5, out=out, pdl=pdl),
                [st.q, st.k_pages, st.v_pages, st.block_table], [out])


CASES = {name[5:]: fn for name, fn in dict(globals()).items() if name.startswith("case_")}


def run_eager(case: Case, pdl: bool) -> list[torch.Tensor]:
    case.reset()
    case.launch(pdl)
    return [o.clone() for o in case.outputs]


def assert_equal(got: list[torch.Tensor], expected: list[torch.Tensor], what: str) -> None:
    for i, (a, b) in enumerate(zip(got, expected)):
        assert not b.isnan().any(), f"{what}: output {i} has unwritten (NaN) elements"
        assert torch.equal(a, b), f"{what}: output {i} differs"


def _rewrite(dst: torch.Tensor, src: torch.Tensor, zeros: torch.Tensor) -> None:
    """In a graph: a PDL-launched Triton kernel writes float inputs (src + 0, the same values), a
    torch copy integer ones (positions, block table)."""
    if dst.is_floating_point():
        add(src, zeros, out=dst, pdl=True)
    else:
        dst.copy_(src)


# -- tests ---------------------------------------------------------------------------------------------


def test_pdl_is_granted_on_a_compiled_hopper_gpu_only():
    assert launch_options(True) == {"launch_pdl": True} and launch_options(False) == {}
    assert use_pdl(True, torch.device("cpu")) is False and use_pdl(False, torch.device("cpu")) is False
    assert pdl_supported(torch.device("cpu")) is False
    if DEVICE == "cuda":
        hopper = torch.cuda.get_device_capability()[0] >= 9
        assert use_pdl(True, torch.device(DEVICE)) is hopper and use_pdl(False, torch.device(DEVICE)) is False


def test_every_launcher_has_a_case():
    """Each public launcher of the decode path takes ``pdl`` and is checked below."""
    launchers = [rms_norm, add, linear, apply_rope, write_kv, write_pages, silu_mul, q_norm_rope,
                 k_norm_rope_write, attention_inputs, paged_decode_attention, paged_prefill_attention]
    assert all("pdl" in inspect.signature(fn).parameters for fn in launchers)
    covered = {"rms_norm_rows", "rms_norm_heads", "add", "linear_residual", "apply_rope", "write_kv",
               "write_pages", "silu_mul", "q_norm_rope", "k_norm_rope_write", "attention_inputs",
               "inputs_per_op", "decode_g4_splits", "decode_g1_one_split", "decode_int8", "prefill"}
    assert set(CASES) == covered


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_pdl_bit_identical_eager_and_in_a_graph(name, t):
    case = CASES[name](QWEN3_4B, t)
    expected = run_eager(case, False)
    assert_equal(run_eager(case, True), expected, f"{name} eager")
    sources = [x.clone() for x in case.inputs]
    zeros = [torch.zeros_like(x) for x in case.inputs]
    copies = [torch.empty_like(o) for o in case.outputs]
    out_zeros = [torch.zeros_like(o) for o in case.outputs]

    def body():
        for x, src, z in zip(case.inputs, sources, zeros):
            _rewrite(x, src, z)  # the kernel before writes what the launcher reads
        case.launch(True)
        for o, c, z in zip(case.outputs, copies, out_zeros):
            add(o, z, out=c, pdl=True)  # the kernel after reads what it wrote

    case.reset()
    body()  # eagerly first: every kernel compiled before the capture
    torch.cuda.synchronize()
    assert_equal(case.outputs, expected, f"{name} eager chain")
    assert_equal(copies, expected, f"{name} eager chain, the kernel after")
    graph = torch.cuda.CUDAGraph()
    case.reset()
    with torch.cuda.graph(graph):
        body()
    for _ in range(10):
        for x in case.inputs:
            x.zero_()
        case.reset()
        for c in copies:
            c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_equal(case.outputs, expected, f"{name} graph")
        assert_equal(copies, expected, f"{name} graph, the kernel after")


# -- a whole decode chain --------------------------------------------------------------------------------


class Layer:
    def __init__(self, s: Shapes, n: int):
        g = generator("layer", n)
        d, kv = s.head_dim, s.kv_heads
        weight = lambda rows, cols: randn((rows, cols), s.dtype, g, cols ** -0.5)  # noqa: E731
        norm_w = lambda n_: norm_weight(n_, s.dtype, g)  # noqa: E731
        self.input_norm, self.post_norm = norm_w(s.hidden), norm_w(s.hidden)
        self.qkv = weight((s.heads + 2 * kv) * d, s.hidden)
        self.o = weight(s.hidden, s.heads * d)
        self.gate_up = weight(2 * s.inter, s.hidden)
        self.down = weight(s.hidden, s.inter)
        self.q_w, self.k_w = norm_w(d), norm_w(d)
        self.step = Step(s, 1, ("layer-pages", n))


def decode_chain(s: Shapes, layers: list[Layer], h, fused: bool, pdl: bool):
    """The decode step's kernels for ``layers`` (as plugins/triton runs them: fused, or one kernel
    per op), from the residual stream ``h`` ``[T, hidden]``; returns the new one."""
    lin = linear_fused if fused else linear_per_op
    for layer in layers:
        st = layer.step
        qkv = lin(h, layer.qkv, norm_weight=layer.input_norm, eps=EPS, pdl=pdl)
        args = (layer.q_w, layer.k_w) + st.attention_args()[2:]
        q = (attention_inputs if fused else inputs_per_op)(qkv, *args, pdl=pdl)
        a = paged_decode_attention(q, st.k_pages, st.v_pages, st.block_table, s.start, s.head_dim ** -0.5,
                                   positions=st.positions, num_splits=16, pdl=pdl)
        h = lin(a.reshape(a.shape[0], -1), layer.o, residual=h, pdl=pdl)
        g = lin(h, layer.gate_up, swiglu=True, norm_weight=layer.post_norm, eps=EPS, pdl=pdl)
        h = lin(g, layer.down, residual=h, pdl=pdl)
    return h


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["per-op", "fused"])
def test_gpu_pdl_decode_chain_in_a_graph(fused):
    """Two Qwen3-4B layers of a decode step, every Triton kernel PDL-launched, replayed from one
    graph: the same bits (outputs and KV pages) as the plain eager launches."""
    s = QWEN3_4B
    layers = [Layer(s, n) for n in range(2)]
    g = generator("chain-input", fused)
    h0 = randn((1, s.hidden), s.dtype, g, 4.0)
    pages0 = [(layer.step.k_pages.clone(), layer.step.v_pages.clone()) for layer in layers]

    def restore_pages():
        for layer, (k, v) in zip(layers, pages0):
            layer.step.k_pages.copy_(k)
            layer.step.v_pages.copy_(v)

    h_ref = decode_chain(s, layers, h0, fused, pdl=False)
    pages_ref = [(layer.step.k_pages.clone(), layer.step.v_pages.clone()) for layer in layers]
    restore_pages()
    h_in = h0.clone()
    h_eager = decode_chain(s, layers, h_in, fused, pdl=True)  # also compiles before the capture
    assert torch.equal(h_eager, h_ref)
    restore_pages()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h_out = decode_chain(s, layers, h_in, fused, pdl=True)
    for _ in range(5):
        restore_pages()
        h_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(h_out, h_ref)
        for (k, v), (k_ref, v_ref) in zip([(la.step.k_pages, la.step.v_pages) for la in layers], pages_ref):
            assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
