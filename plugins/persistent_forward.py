"""PersistentForward, the class of ``forward=persistent`` (registered by plugins/persistent.py)."""

from __future__ import annotations

from collections.abc import Collection

import torch

from tileinfer.backends.triton.interpreter import interpreted, kernels_run_on, sms_of
from tileinfer.backends.triton.paged_attention_int8 import Int8Pages, check_int8_pages
from tileinfer.backends.triton.persistent_plan import (ALIGN, BLOCK_N, StepBuffers, StepPlan, StepShape,
                                                       block_n_sizes, layer_pointer_table, qkv_block_n,
                                                       resident_programs)
from tileinfer.backends.triton.persistent import launch_persistent_step
from tileinfer.interfaces import ForwardPass, KVStore, RunSpec, Step
from tileinfer.model import stack_forward
from tileinfer.model_config import ModelConfig
from tileinfer.notices import notice
from tileinfer.options import Option

MAX_TOKENS = 16


class PersistentForward(ForwardPass):
    """``forward=persistent``: see plugins/persistent.py."""

    declared_options = (
        Option("programs_per_sm", int, 2, "programs of the persistent grid per multiprocessor (fewer where "
               "fewer fit: every program must be resident)", minimum=1),
        Option("num_splits", int, 16, "attention partitions per kv head", minimum=1),
        Option("chunk", int, 128, "positions per attention chunk (a multiple of 64); the partitions take "
               "chunks round-robin", minimum=64),
        Option("block_k", int, 256, "K columns per GEMV chunk (a power of two)", minimum=16),
        Option("block_n", str, BLOCK_N, "output columns per GEMV tile of qkv, o_proj, gate_up, down, "
               "lm_head (powers of two >= 16); qkv's may be auto: 16, or 32 where tiles of 16 would take more than "
               "one round of the grid's programs (programs_per_sm x multiprocessors)"),
        Option("num_warps", int, 4, "warps per program of the persistent grid (4 or 8)", minimum=4),
        Option("max_registers", int, 0, "registers a thread at most (the compiler's maxnreg: it spills what does "
               "not fit; 0: its own choice, up to 255); with num_warps, what sets the programs that fit per "
               "multiprocessor", minimum=0),
        Option("split_k", int, 3, "K runs of each o_proj and down tile, their partial sums added by the tile's last "
               "run in run order (more items, each shorter: the stages with the fewest tiles; a down run waits for "
               "the gate_up tiles of its own K range only)", minimum=1),
        Option("stages", int, 3, "how a GEMV item streams its weight chunks: 1, each chunk's successor in registers "
               "(the first before the item waits); 2 or more, the compiler's pipeline of that many stages through "
               "shared memory", minimum=1),
        Option("int8_convert", str, "bits", "how the GEMV items turn int8 weights into floats (the same values): "
               "bit patterns, byte permutes (inline PTX: a GPU only), or Triton's cast",
               choices=("bits", "permute", "cast")),
        Option("item_calls", bool, False, "the work items compiled as functions the kernel calls, not inlined: "
               "each item keeps the registers it needs (inlined, the kernel takes its items' registers together)"),
        Option("timeline", bool, False, "profiling: each work item's program, start and end (ns) of the last step "
               "in the forward pass's ``timeline``, its items in ``timeline_items``"),
    )

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        reasons = []
        if not kernels_run_on(run.device):
            reasons.append(f"the persistent step is a Triton kernel: it needs a CUDA GPU, and device is "
                           f"{run.device.type} (or set TRITON_INTERPRET=1)")
        o = run.options
        try:
            sizes = block_n_sizes(o["block_n"])
        except ValueError as e:
            sizes = ()
            reasons.append(f"options.persistent.{e}")
        if o["block_k"] & (o["block_k"] - 1):
            reasons.append(f"options.persistent.block_k={o['block_k']}: a power of two")
        elif sizes and sizes[2] > o["block_k"]:
            reasons.append(f"options.persistent.block_n: gate_up's {sizes[2]} columns exceed block_k={o['block_k']} "
                           "(a gate_up tile must lie in one K run of the down tiles)")
        if o["chunk"] % 64:
            reasons.append(f"options.persistent.chunk={o['chunk']}: a multiple of 64")
        if o["num_warps"] not in (4, 8):
            reasons.append(f"options.persistent.num_warps={o['num_warps']}: 4 or 8")
        if o["max_registers"] > 255:
            reasons.append(f"options.persistent.max_registers={o['max_registers']}: at most 255")
        return reasons

    def __init__(self, model, *, options=None) -> None:
        super().__init__(model, options=options)
        self._noticed: set[str] = set()
        self._bound: tuple[KVStore, torch.Tensor, StepBuffers] | None = None
        self._plans: dict[tuple[bool, tuple[int, ...]], StepPlan] = {}
        self._programs = 0
        self.timeline: torch.Tensor | None = None
        self.timeline_items: torch.Tensor | None = None
        self.reason = self._model_reason(model)
        if self.reason is None:
            self.shape = self._shape(model)
        self._note(self.reason)

    def _model_reason(self, model) -> str | None:
        c = stack_config(model)
        if c is None:
            return f"it runs Qwen3 decoder stacks, not {type(model).__name__}"
        layers = model.layers
        if c.head_dim < 16 or c.head_dim & (c.head_dim - 1):
            return f"head_dim {c.head_dim} is not a power of two >= 16"
        linears = [lin for layer in layers for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
        layouts = {getattr(lin, "int8_layout", "rows") for lin in linears + [model.lm_head]} - {"rows"}
        if layouts:
            return f"options.triton.int8_layout={layouts.pop()}: the persistent step reads int8 weights in rows"
        if any(not hasattr(lin, "weight") or not hasattr(lin, "scale") for lin in linears + [model.lm_head]):
            return "the linear implementation keeps no weight and scale it can read"
        formats = {(lin.weight.dtype, lin.scale is None) for lin in linears}
        if len(formats) > 1:
            return "the layers' linears store their weights in different formats"
        read = [t for lin in linears for t in (lin.weight, lin.scale) if t is not None]
        read += [t for layer in layers for t in (layer.qkv.norm.weight, layer.gate_up.norm.weight,
                                                 layer.attention.q_norm_weight, layer.attention.k_norm_weight)]
        if any(t.data_ptr() % ALIGN for t in read):
            return f"a weight it reads is not {ALIGN}-byte aligned"
        return None

    def _shape(self, model) -> StepShape:
        """The options' tiles (an ``auto`` qkv tile by :func:`qkv_block_n` over the grid asked for,
        ``programs_per_sm`` a multiprocessor); under the interpreter, which runs the work items one
        after another at a fixed cost each, at least 64 columns a GEMV tile and at most 2 splits a kv
        head."""
        c, o = stack_config(model), self.options
        qkv, *rest = block_n_sizes(o["block_n"])
        if qkv is None:
            qkv = qkv_block_n((c.num_heads + 2 * c.num_kv_heads) * c.head_dim,
                              sms_of(model.device) * o["programs_per_sm"])
        block_n, splits = (qkv, *rest), o["num_splits"]
        if interpreted(model.device):
            block_n, splits = tuple(max(b, 64) for b in block_n), min(splits, 2)
        return StepShape(hidden=c.hidden_size, heads=c.num_heads, kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                         intermediate=c.intermediate_size, vocab=model.lm_head.out_features, layers=c.num_layers,
                         page_size=0, num_splits=splits, chunk=o["chunk"], block_k=o["block_k"], block_n=block_n,
                         split_k=o["split_k"])

    def _note(self, reason: str | None) -> None:
        if reason is not None and reason not in self._noticed:
            self._noticed.add(reason)
            notice(f"forward=persistent: {reason}; those steps run the per-op step")

    def _bind(self, kv: KVStore) -> tuple[torch.Tensor, StepBuffers]:
        """The pointer table and buffers for ``kv``'s pages (built once per store; the grid is sized
        again for the kernel of its page format)."""
        if self._bound is None or self._bound[0] is not kv:
            m = self.model
            pages = [kv.layer(n) for n in range(len(m.layers))]
            int8 = kv.storage == "int8"
            if int8:  # the kernel takes one set of scale strides for K and V, slots contiguous
                check_int8_pages(Int8Pages(pages[0].k_scale, pages[0].v_scale, pages[0].k_smooth), pages[0].k,
                                 pages[0].v)
            self.shape = StepShape(**{**self.shape.__dict__, "page_size": kv.page_size, "kv_int8": int8,
                                      "k_smooth": int8 and pages[0].k_smooth is not None})
            self._programs = 0
            rows = []
            for layer, page in zip(m.layers, pages):
                rows.append(dict(qkv_w=layer.qkv.weight, qkv_s=_scale(layer.qkv), o_w=layer.o_proj.weight,
                                 o_s=_scale(layer.o_proj), gate_up_w=layer.gate_up.weight,
                                 gate_up_s=_scale(layer.gate_up), down_w=layer.down.weight,
                                 down_s=_scale(layer.down), input_norm=layer.qkv.norm.weight,
                                 post_norm=layer.gate_up.norm.weight, q_norm=layer.attention.q_norm_weight,
                                 k_norm=layer.attention.k_norm_weight, k_pages=page.k, v_pages=page.v,
                                 k_scale=page.k_scale, v_scale=page.v_scale, k_smooth=page.k_smooth))
            table = layer_pointer_table(rows, m.device)
            bufs = StepBuffers.allocate(self.shape, m.embed.dtype, m.device, captures=len(m.layers))
            self._bound = (kv, table, bufs)
            self._plans.clear()
        return self._bound[1], self._bound[2]

    def _step_reason(self, step: Step, kv: KVStore) -> str | None:
        if self.reason is not None:
            return self.reason
        if kv.storage not in ("dtype", "int8"):
            return f"KV pages stored as {kv.storage} are not covered yet"
        return None

    def __call__(self, token_ids: torch.Tensor, step: Step, kv: KVStore, *, capture: Collection[int] = (),
                 rows: torch.Tensor | None = None, last_only: bool = False,
                 logits: bool = True) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
        reason = self._step_reason(step, kv)
        if reason is not None or step.num_tokens > MAX_TOKENS:
            self._note(reason)
            return stack_forward(self.model, token_ids, step, kv, capture=capture, rows=rows, last_only=last_only,
                                 logits=logits)
        m, t = self.model, step.num_tokens
        table, bufs = self._bind(kv)
        key = (logits, tuple(sorted(capture)))
        plan = self._plans.get(key) or self._plans.setdefault(
            key, StepPlan.build(self.shape, m.device, logits=logits, capture=key[1]))
        torch.index_select(m.embed, 0, token_ids, out=bufs.h[:t])
        self._launch(plan, table, bufs, step)
        hidden = {layer: bufs.capture[i, :t] for i, layer in enumerate(plan.capture)}
        if not logits:
            return None, hidden
        out = bufs.logits[:t]
        if rows is not None:
            out = out.index_select(0, rows)
        elif last_only:
            out = out[-1:]
        return out, hidden

    def _launch(self, plan: StepPlan, table: torch.Tensor, bufs: StepBuffers, step: Step) -> None:
        m, kv_pages = self.model, self._bound[0].layer(0)
        layer0 = m.layers[0]
        lm = m.lm_head
        args = (plan, self.shape, bufs, table, step.positions, self._bound[0].block_table, layer0.attention.rope.cos,
                layer0.attention.rope.sin, lm.weight, lm.scale, lm.norm.weight, layer0.qkv.weight,
                tuple(kv_pages.k.stride()[:3]), stack_config(m).rms_norm_eps)
        scales = (0, 0) if kv_pages.k_scale is None else tuple(kv_pages.k_scale.stride()[:2])
        dot_f32 = interpreted(m.device)
        launch = dict(scale_strides=scales, num_warps=self.options["num_warps"],
                      max_registers=self.options["max_registers"], timeline=self._timeline(plan),
                      causal=step.causal, stages=self.options["stages"],
                      item_calls=self.options["item_calls"], int8_convert=self.options["int8_convert"])
        if not self._programs:
            self._programs = 1 if dot_f32 else self._grid(args, launch)
        launch_persistent_step(*args, self._programs, dot_f32, **launch)

    def _timeline(self, plan: StepPlan) -> torch.Tensor | None:
        """The timeline buffer of ``plan``'s items where ``options.timeline`` (not under the interpreter)."""
        if not self.options["timeline"] or interpreted(self.model.device):
            return None
        if self.timeline_items is not plan.items:
            self.timeline_items = plan.items
            self.timeline = torch.zeros(plan.items.shape[0], 3, dtype=torch.int64, device=self.model.device)
        return self.timeline

    def _grid(self, args: tuple, launch: dict) -> int:
        """Programs of the grid: ``programs_per_sm`` per multiprocessor, fewer where fewer fit."""
        device = self.model.device
        sms = sms_of(device)
        compiled = launch_persistent_step(*args, sms, False, **launch, warmup=True)
        shared = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
        fit = resident_programs(compiled, sms, shared)
        per_sm = min(self.options["programs_per_sm"], fit)
        if per_sm < 1:
            raise RuntimeError("the persistent step's kernel does not fit on a multiprocessor")
        if per_sm < self.options["programs_per_sm"]:
            notice(f"forward=persistent: {per_sm} programs per multiprocessor fit "
                   f"(options.persistent.programs_per_sm={self.options['programs_per_sm']})")
        return sms * per_sm


def stack_config(model) -> ModelConfig | None:
    """The ModelConfig of a decoder stack the kernel runs (``embed``, ``layers`` of qkv / attention /
    o_proj / gate_up / down, ``lm_head``: a Qwen3Model, or the DFlash drafter, whose ``config.model``
    it is), or None for anything else."""
    config = getattr(model, "config", None)
    config = config if isinstance(config, ModelConfig) else getattr(config, "model", None)
    stack = all(hasattr(model, name) for name in ("embed", "layers", "lm_head"))
    return config if isinstance(config, ModelConfig) and stack else None


def _scale(linear) -> torch.Tensor:
    """A linear's float32 row scales; its weight stands in where it has none (never read)."""
    return linear.weight if linear.scale is None else linear.scale
