"""A tileinfer plugin package: the README's example, installed and used by the tests."""
