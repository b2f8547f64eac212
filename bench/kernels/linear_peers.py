"""The kernel-level peer of ``python -m bench kernels linear`` (linear.py) for int8 weights:
gemlite's A16W8 GEMV/GEMM, built from the same int8 rows and scales, timed as the Triton linear is."""

from __future__ import annotations

import torch


def gemlite_a16w8():
    """``(build, what)``: ``build(q, scale)`` makes gemlite's A16W8 linear from an int8 weight ``q``
    ``[N, K]`` and its float32 scales ``[N]``, ``what`` gemlite's version; or ``(None, why)`` where
    gemlite does not import."""
    try:
        import gemlite
        from gemlite.helper import A16W8_INT8
    except Exception as exc:  # noqa: BLE001 - any import failure is recorded as the reason
        return None, f"gemlite does not import ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]})"

    def build(q: torch.Tensor, scale: torch.Tensor):
        return A16W8_INT8(device=str(q.device), dtype=torch.bfloat16).from_weights(weight=q, scales=scale[:, None])

    return build, f"gemlite {gemlite.__version__}"


def gemlite_row(layers: list | str, x: torch.Tensor, expected: torch.Tensor, repeats: int) -> dict:
    """gemlite's time per call over the rotated weight copies ``layers`` and its max error against
    the twin's ``expected``; ``gemlite_error`` instead where it was not built (``layers`` is then the
    reason) or failed."""
    if isinstance(layers, str):
        return {"gemlite_error": layers}
    try:
        err = (layers[0](x).float() - expected.float()).abs().max().item()
        from .linear import rotated_seconds

        return {"gemlite_us": rotated_seconds(lambda g: g(x), layers, repeats) * 1e6, "gemlite_max_abs_err": err}
    except Exception as e:  # noqa: BLE001 - a peer kernel that fails is reported, the sweep goes on
        return {"gemlite_error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}


__all__ = ["gemlite_a16w8", "gemlite_row"]
