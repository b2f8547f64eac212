"""The shipped models (target/, draft/, dflash/: Hugging Face checkpoint folders, data of this package),
the benchmark prompts on the held-out files (``prompts``), and the pipeline that made the models, each
stage a module run with ``python -m tileinfer.models.<stage>`` (models/README.md)."""
