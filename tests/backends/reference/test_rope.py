"""apply_rope (backends/reference/rope.py) against a rotation of complex numbers in float64."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.rope import apply_rope
from tileinfer.model import rope_table


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("d", [16, 64, 128])
def test_apply_rope_matches_complex_rotation(d):
    theta, positions = 10000.0, torch.tensor([0, 1, 7, 100, 511])
    table = rope_table(d, theta, 512, torch.device("cpu"))
    x = torch.randn(len(positions), 3, d, generator=gen(21))
    out = apply_rope(x, table.cos[positions], table.sin[positions])
    # independent: channel i pairs with i + d/2 as a complex number, rotated by pos * theta^(-2i/d)
    i = torch.arange(d // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * theta ** (-2 * i / d)  # [T, d/2]
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double()) * torch.polar(
        torch.ones_like(angle), angle)[:, None, :]
    ref = torch.cat((z.real, z.imag), -1)
    torch.testing.assert_close(out.double(), ref, atol=2e-4, rtol=1e-4)  # float32 angles at position 511
    assert torch.equal(out[0], x[0])  # position 0 is the identity
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps norms
