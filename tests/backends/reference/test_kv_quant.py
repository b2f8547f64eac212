"""Per-vector INT8 of the KV cache (backends/reference/kv_quant.py) against its error bound."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.kv_quant import dequantize_per_vector, quantize_per_vector


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_quantize_per_vector_round_trip():
    x = torch.randn(7, 3, 64, generator=gen(11)) * torch.logspace(-2, 2, 7)[:, None, None]
    q, scale = quantize_per_vector(x)
    assert q.dtype == torch.int8 and scale.shape == (7, 3)
    assert q.abs().max() <= 127 and (q.abs().amax(-1) == 127).all()
    err = (dequantize_per_vector(q, scale, torch.float32) - x).abs()
    assert (err <= scale[..., None] / 2 * (1 + 1e-5)).all()
    # a single scale per row would not satisfy the bound for the small vectors
    assert err[0].max() < x[0].abs().max() / 100


def test_the_scale_is_absmax_times_the_float32_reciprocal_of_127():
    """The formula the Triton writes reproduce bit for bit (a product: torch divides CUDA tensors by
    a scalar through its reciprocal, CPU tensors exactly), and round half to even."""
    x = torch.randn(5, 64, generator=gen(12)) * 3
    _, scale = quantize_per_vector(x)
    assert torch.equal(scale, x.abs().amax(-1) * torch.tensor(1 / 127, dtype=torch.float32))
    q, scale = quantize_per_vector(torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 0.0]]))
    assert scale.item() == 1.0 and q.tolist() == [[127, 0, 2, 2, 0, -2, 0]]
    q, scale = quantize_per_vector(torch.zeros(1, 8))
    assert (q == 0).all() and scale.item() > 0


def test_write_quantized_smooths_keys_only():
    from tileinfer.backends.reference.kv_quant import key_smoothing, quantize_keys, write_quantized

    g = gen(13)
    k, v = torch.randn(3, 2, 16, generator=g), torch.randn(3, 2, 16, generator=g)
    smooth = key_smoothing(torch.rand(16, generator=g) + 0.5)
    pages = [torch.zeros(2, 2, 4, 16, dtype=torch.int8) for _ in range(2)]
    scales = [torch.zeros(2, 2, 4) for _ in range(2)]
    table, positions = torch.tensor([1, 0], dtype=torch.int32), torch.tensor([2, 3, 4])
    write_quantized(*pages, *scales, table, positions, k, v, smooth)
    kq, ks = quantize_keys(k, smooth)
    vq, vs = quantize_per_vector(v)
    assert torch.equal(pages[0][1, :, 2], kq[0]) and torch.equal(pages[0][0, :, 0], kq[2])
    assert torch.equal(scales[0][1, :, 3], ks[1]) and torch.equal(pages[1][1, :, 3], vq[1])
    assert torch.equal(scales[1][0, :, 0], vs[2])
    assert torch.equal(kq, quantize_per_vector(k / smooth)[0]) and not torch.equal(kq, quantize_per_vector(k)[0])
