"""The shipped models (target/, draft/: Hugging Face checkpoint folders, data of this package) and
the scripts that made them (run as scripts, not imported: models/README.md)."""
