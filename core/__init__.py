"""tileinfer: single-sequence LLM inference for Qwen3, composed from plugins by a config file.

    engine = tileinfer.Engine.from_config(model="path/to/Qwen3-0.6B")
    print(engine.generate("def fib(n):", tileinfer.SamplingParams(max_tokens=32, stop=["\\n\\n"])).text)

Loading a model without an engine (what the draft and DFlash proposers do):
``read_checkpoint(folder)`` reads its config, generation defaults and tokenizer once;
``load_model(checkpoint, Implementations.of(config, registry), device=, dtype=, positions=)``
builds it with a KV store of its own (``tileinfer.model_loader``).
"""

from tileinfer.hookspecs import Implementation, hookimpl, hookspec
from tileinfer.options import Option

__version__ = "0.1.0"


def __getattr__(name: str):
    # Engine pulls in torch and the model; keep `import tileinfer` cheap for plugin modules.
    if name == "Engine":
        from tileinfer.engine import Engine

        return Engine
    if name in ("Chunk", "Generation", "GenerationStats"):
        from tileinfer import generation

        return getattr(generation, name)
    if name in ("Config", "load_config", "resolve_config"):
        from tileinfer import config

        return getattr(config, name)
    if name in ("Checkpoint", "model_folder", "read_checkpoint", "shipped_model"):
        from tileinfer import checkpoint

        return getattr(checkpoint, name)
    if name in ("Implementations", "ModelBundle", "load_model", "open_weights"):
        from tileinfer import model_loader

        return getattr(model_loader, name)
    if name == "SamplingParams":
        from tileinfer.sampling_params import SamplingParams

        return SamplingParams
    if name in ("StructuredOutput", "StructuredOutputError"):
        from tileinfer import structured

        return getattr(structured, name)
    if name == "ResolvedConfig":
        from tileinfer.resolution import ResolvedConfig

        return ResolvedConfig
    raise AttributeError(f"module 'tileinfer' has no attribute {name!r}")


__all__ = ["Checkpoint", "Chunk", "Config", "Engine", "Generation", "GenerationStats", "Implementation",
           "Implementations", "ModelBundle", "Option", "ResolvedConfig", "SamplingParams", "StructuredOutput",
           "StructuredOutputError", "hookimpl", "hookspec", "load_config", "load_model", "model_folder", "open_weights",
           "read_checkpoint", "resolve_config", "shipped_model"]
