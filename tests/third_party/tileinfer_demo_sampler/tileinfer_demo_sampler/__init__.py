"""A tileinfer plugin package: the example of docs/plugins.md, installed and used by the tests."""
