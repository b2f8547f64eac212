"""The fused attention inputs (backends/triton/attention_inputs.py): ``attention_inputs`` (one
launch where the q and kv heads share ``norm_launch_config``, else two) and the launches of its
parts, ``q_norm_rope`` and ``k_norm_rope_write``, against the twin (backends/reference/
attention_inputs.py: split qkv, ``rms_norm`` of q and k heads, ``apply_rope``, ``write_pages``), and
bit for bit against the chain of per-op kernels (per_op_chains.inputs_per_op: copies, ``rms_norm``,
``apply_rope``, ``write_kv``).

q and the pages are poisoned with NaN before each launch, so an unwritten element fails; the block
table is a random page permutation and positions cross page boundaries.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference import attention_inputs as ref
from tileinfer.backends.triton import attention_inputs as attention_inputs_module
from tileinfer.backends.triton.attention_inputs import attention_inputs, k_norm_rope_write, q_norm_rope
from tileinfer.backends.triton.rms_norm import norm_launch_config
from tileinfer.model import rope_table

from ..kernel_checks import DEVICE, EPS, MIN_EXACT, THETA, assert_close, assert_same, generator, poisoned, randn
from .per_op_chains import inputs_per_op


class Case:
    """Random inputs of one step: qkv, norm weights, rope tables, positions, poisoned pages."""

    def __init__(self, t, heads, kv_heads, head_dim, dtype, page_size, num_pages, key):
        g = generator(*key)
        self.t, self.heads, self.kv_heads, self.d, self.dtype = t, heads, kv_heads, head_dim, dtype
        width = (heads + 2 * kv_heads) * head_dim
        self.qkv = randn((t, width), dtype, g, 2.0)
        self.q_w = (torch.rand(head_dim, generator=g, device=DEVICE) + 0.5).to(dtype)
        self.k_w = (torch.rand(head_dim, generator=g, device=DEVICE) + 0.5).to(dtype)
        capacity = page_size * num_pages
        self.table = rope_table(head_dim, THETA, capacity, torch.device(DEVICE))
        start = int(torch.randint(0, capacity - t + 1, (1,), generator=g, device=DEVICE))
        self.positions = torch.arange(start, start + t, device=DEVICE)
        self.block_table = torch.randperm(num_pages, generator=g, device=DEVICE).to(torch.int32)
        self.page_shape = (num_pages, kv_heads, page_size, head_dim)

    def pages(self):
        return poisoned(self.page_shape, self.dtype), poisoned(self.page_shape, self.dtype)

    def nan_q(self):
        return poisoned((self.t, self.heads, self.d), self.dtype)

    def args(self):
        """The tail of the argument list shared by the fused launches and the per-op chain."""
        return self.heads, self.kv_heads, self.d, EPS

    def reference(self):
        """The twin: returns q and the two page tensors."""
        k_pages, v_pages = self.pages()
        q = ref.attention_inputs(self.qkv, self.q_w, self.k_w, self.table.cos, self.table.sin, self.positions,
                                 k_pages, v_pages, self.block_table, *self.args())
        return q, k_pages, v_pages

    def fused(self, qkv=None):
        """``attention_inputs``, on ``qkv`` (a view of the same values) if given."""
        k_pages, v_pages = self.pages()
        q = attention_inputs(self.qkv if qkv is None else qkv, self.q_w, self.k_w, self.table.cos, self.table.sin,
                             self.positions, k_pages, v_pages, self.block_table, *self.args(), out=self.nan_q())
        return q, k_pages, v_pages

    def parts(self):
        """The two launches of ``attention_inputs``' parts, each with its own heads' tiles."""
        q = q_norm_rope(self.qkv, self.q_w, self.table.cos, self.table.sin, self.positions, *self.args(),
                        out=self.nan_q())
        k_pages, v_pages = self.pages()
        k_norm_rope_write(self.qkv, self.k_w, self.table.cos, self.table.sin, self.positions,
                          k_pages, v_pages, self.block_table, *self.args())
        return q, k_pages, v_pages

    def per_op(self):
        k_pages, v_pages = self.pages()
        q = inputs_per_op(self.qkv, self.q_w, self.k_w, self.table.cos, self.table.sin, self.positions,
                          k_pages, v_pages, self.block_table, *self.args())
        return q, k_pages, v_pages


def assert_near_reference(actual, expected):
    """Within two roundings of the twin after the norm and RoPE, NaN exactly where the twin left a
    page slot unwritten, nearly every element bit-identical."""
    assert_close(actual, expected, "norm_rope", min_exact=MIN_EXACT, equal_nan=True)


def check(case: Case):
    ref_q, ref_k, ref_v = case.reference()
    un_q, un_k, un_v = case.per_op()
    for q, k_pages, v_pages in (case.fused(), case.parts()):
        assert not q.isnan().any()
        assert_near_reference(q, ref_q)
        assert_near_reference(k_pages, ref_k)
        assert_same(v_pages, ref_v)  # v is copied, bit for bit
        assert torch.equal(q, un_q)
        assert_same(k_pages, un_k)
        assert_same(v_pages, un_v)


def one_launch(heads: int, kv_heads: int, head_dim: int) -> bool:
    return norm_launch_config(head_dim, heads) == norm_launch_config(head_dim, kv_heads)


# (T, heads, kv_heads, head_dim, dtype): every T, group sizes 1, 2, 4, both head dims and dtypes; the
# q and kv heads' tiles differ (two launches) but where marked: one launch, masked columns included
CPU_CASES = [
    (1, 2, 2, 128, torch.float16),
    (2, 4, 2, 64, torch.float32),
    (7, 8, 2, 128, torch.float16),
    (7, 2, 2, 64, torch.float32),
    (16, 4, 1, 64, torch.float16),
    (16, 8, 2, 128, torch.float32),
    (17, 4, 2, 64, torch.float16),
    (17, 12, 3, 128, torch.float32),
    (1, 8, 2, 64, torch.float32),
    (3, 16, 8, 128, torch.float16),  # one launch: 2 q columns, 1 kv column of 8 heads
    (5, 24, 12, 128, torch.float32),  # one launch: 3 q columns, 2 kv columns (4 heads masked)
    (4, 12, 6, 256, torch.float16),  # one launch of [4, 128] tiles: 3 q columns, 2 kv columns (2 masked)
    (2, 32, 8, 128, torch.float16),  # one launch: Qwen3-4B's heads
    (9, 2, 2, 64, torch.float16),  # one launch: group 1, one column each
]


@pytest.mark.parametrize("t,heads,kv_heads,head_dim,dtype", CPU_CASES,
                         ids=[f"T{c[0]}-H{c[1]}-Hkv{c[2]}-D{c[3]}-{str(c[4])[6:]}" for c in CPU_CASES])
def test_attention_inputs(t, heads, kv_heads, head_dim, dtype):
    check(Case(t, heads, kv_heads, head_dim, dtype, page_size=8, num_pages=8,
               key=("attention_inputs", t, heads, kv_heads, head_dim, dtype)))


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 64), (16, 8, 128)], ids=["two-launches", "one-launch"])
def test_attention_inputs_strided_qkv(heads, kv_heads, head_dim):
    """``attention_inputs`` on a qkv view whose rows are wider than q|k|v."""
    case = Case(5, heads, kv_heads, head_dim, torch.float16, page_size=4, num_pages=4, key=("strided", heads))
    wide = randn((case.t, case.qkv.shape[1] + 32), case.dtype, generator("wide"))
    wide[:, 16:16 + case.qkv.shape[1]] = case.qkv
    view = wide[:, 16:16 + case.qkv.shape[1]]
    ref_q, ref_k, ref_v = case.reference()
    un_q, un_k, un_v = case.per_op()
    q, k_pages, v_pages = case.fused(view)
    assert_near_reference(q, ref_q)
    assert_near_reference(k_pages, ref_k)
    assert_same(v_pages, ref_v)
    assert torch.equal(q, un_q)
    assert_same(k_pages, un_k)
    assert_same(v_pages, un_v)


class Grids:
    """A kernel whose launch grids are recorded."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


# (heads, kv_heads, head_dim, grids of attention_inputs at T = 3): one (T, q + kv columns) where the
# tiles agree, else the kv columns with the kv heads' BLOCK_H, then the q columns with the q heads'
LAUNCH_CASES = [
    (32, 8, 128, [(3, 5)]),
    (24, 12, 128, [(3, 5)]),
    (12, 6, 256, [(3, 5)]),
    (2, 2, 64, [(3, 2)]),
    (12, 3, 128, [(3, 1), (3, 2)]),  # kv: BLOCK_H 4, 1 warp; q: BLOCK_H 8, 2 warps
    (4, 2, 64, [(3, 1), (3, 1)]),  # BLOCK_H 2 and 4
]


@pytest.mark.parametrize("heads,kv_heads,head_dim,grids", LAUNCH_CASES,
                         ids=[f"H{c[0]}-Hkv{c[1]}-D{c[2]}" for c in LAUNCH_CASES])
def test_launches(monkeypatch, heads, kv_heads, head_dim, grids):
    """One kernel launch exactly where the q and kv heads' ``norm_launch_config`` agree."""
    assert (len(grids) == 1) == one_launch(heads, kv_heads, head_dim)
    kernel = Grids(attention_inputs_module._attention_inputs_kernel)
    monkeypatch.setattr(attention_inputs_module, "_attention_inputs_kernel", kernel)
    case = Case(3, heads, kv_heads, head_dim, torch.float16, page_size=4, num_pages=4, key=("launches", heads))
    q, k_pages, _ = case.fused()
    assert kernel.grids == grids
    un_q, un_k, _ = case.per_op()
    assert torch.equal(q, un_q)
    assert_same(k_pages, un_k)


# -- GPU: bfloat16 at Qwen3-4B's attention shape (32 q heads, 8 kv heads, head_dim 128) --------------


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_attention_inputs_bf16(t):
    check(Case(t, 32, 8, 128, torch.bfloat16, page_size=64, num_pages=64, key=("gpu", t)))
