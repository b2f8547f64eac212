"""``python -m bench stream-probe``: every loading scheme computes ``x W^T`` for every weight tile,
checked under the interpreter with one program taking every item (float16, odd row counts that
leave the 16- and 64-row tiles part empty, K not a multiple of the chunk); without a GPU the
command says so in one line."""

from __future__ import annotations

import pytest
import torch

from bench.__main__ import main as bench
from bench.stream_probe import MODES, Probe, reference

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's tests (CPU tensors)")


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_computes_x_w_t(mode):
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(n, k, generator=g).to(torch.float16) for n, k in ((40, 96), (24, 72), (70, 96))]
    x = torch.randn(16, 96, generator=g).to(torch.float16)
    y = Probe(mode, weights, x, block_k=32, stages=2)(programs=1)
    assert not y.isnan().any(), "every output written"
    torch.testing.assert_close(y.float(), reference(weights, x), rtol=2e-3, atol=2e-3)


def test_says_in_one_line_that_it_needs_a_gpu(capsys):
    assert bench(["stream-probe"]) == 2
    assert capsys.readouterr().err == "error: python -m bench stream-probe needs a CUDA GPU (none is visible)\n"
