"""tileinfer: single-sequence LLM inference for Qwen3, composed from plugins by a config file.

    engine = tileinfer.Engine.from_config(model="path/to/Qwen3-0.6B")
    print(engine.generate("def fib(n):", max_new_tokens=32).text)
"""

from tileinfer.hookspecs import Implementation, hookimpl, hookspec
from tileinfer.options import Option

__version__ = "0.1.0"


def __getattr__(name: str):
    # Engine pulls in torch and the model; keep `import tileinfer` cheap for plugin modules.
    if name in ("Chunk", "Engine", "Generation", "GenerationStats"):
        from tileinfer import engine

        return getattr(engine, name)
    if name in ("Config", "load_config", "resolve_config"):
        from tileinfer import config

        return getattr(config, name)
    raise AttributeError(f"module 'tileinfer' has no attribute {name!r}")


__all__ = ["Chunk", "Config", "Engine", "Generation", "GenerationStats", "Implementation", "Option", "hookimpl",
           "hookspec", "load_config", "resolve_config"]
