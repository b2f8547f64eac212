"""Plugin ``paged_kv``: the paged KV stores, pages in the model dtype (``paged``) or INT8 (``paged_int8``)."""

from __future__ import annotations

import torch

from tileinfer import hookimpl
from tileinfer.backends.reference.kv_quant import dequantize_per_vector, key_smoothing, write_quantized
from tileinfer.backends.reference.kv_write import write_pages
from tileinfer.backends.reference.paged_attention import gather_pages
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import KVGeometry, KVStore, LayerKV


def empty_pages(geometry: KVGeometry, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialized K and V pages of every layer, ``[num_layers, num_pages, num_kv_heads,
    page_size, head_dim]`` of ``dtype``."""
    g = geometry
    shape = (g.num_layers, g.num_pages, g.num_kv_heads, g.page_size, g.head_dim)
    return torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device)


class PagedKVStore(KVStore):
    """Pages in the model dtype: ``[num_pages, num_kv_heads, page_size, head_dim]`` per layer."""

    def __init__(self, geometry: KVGeometry, device, *, key_norm_weights=None, options=None) -> None:
        super().__init__(geometry, device, key_norm_weights=key_norm_weights, options=options)
        self.k, self.v = empty_pages(geometry, geometry.dtype, self.device)

    def write(self, layer, positions, k, v) -> None:
        write_pages(self.k[layer], self.block_table, positions, k)
        write_pages(self.v[layer], self.block_table, positions, v)

    def layer(self, layer) -> LayerKV:
        return LayerKV(self.k[layer], self.v[layer])

    def gather(self, layer, length):
        return (gather_pages(self.k[layer], self.block_table, length),
                gather_pages(self.v[layer], self.block_table, length))


class PagedInt8KVStore(KVStore):
    """INT8 pages with one float32 scale per cached vector (per position and KV head); keys are
    divided by ``key_smoothing`` of the layer's key RMSNorm weight before quantizing."""

    storage = "int8"

    def __init__(self, geometry: KVGeometry, device, *, key_norm_weights=None, options=None) -> None:
        super().__init__(geometry, device, key_norm_weights=key_norm_weights, options=options)
        self.k, self.v = empty_pages(geometry, torch.int8, self.device)
        self.k_scale = torch.empty(self.k.shape[:-1], dtype=torch.float32, device=self.device)
        self.v_scale = torch.empty(self.k.shape[:-1], dtype=torch.float32, device=self.device)
        if key_norm_weights is None:
            self.k_smooth = torch.ones(geometry.num_layers, geometry.head_dim, dtype=torch.float32, device=self.device)
        else:
            self.k_smooth = torch.stack([key_smoothing(w).to(self.device) for w in key_norm_weights])

    def write(self, layer, positions, k, v) -> None:
        write_quantized(self.k[layer], self.v[layer], self.k_scale[layer], self.v_scale[layer], self.block_table,
                        positions, k, v, self.k_smooth[layer])

    def layer(self, layer) -> LayerKV:
        return LayerKV(self.k[layer], self.v[layer], self.k_scale[layer], self.v_scale[layer], self.k_smooth[layer])

    def gather(self, layer, length):
        dtype = self.geometry.dtype
        k = dequantize_per_vector(gather_pages(self.k[layer], self.block_table, length),
                                  gather_pages(self.k_scale[layer], self.block_table, length), dtype)
        v = dequantize_per_vector(gather_pages(self.v[layer], self.block_table, length),
                                  gather_pages(self.v_scale[layer], self.block_table, length), dtype)
        return k, v


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [
        Implementation("kv_store", "paged", PagedKVStore, "pages in the model dtype"),
        Implementation("kv_store", "paged_int8", PagedInt8KVStore,
                       "INT8 pages, a float32 scale per vector, keys smoothed by the k-norm weight"),
    ]
