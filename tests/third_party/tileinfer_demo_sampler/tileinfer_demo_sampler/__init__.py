"""A third-party tileinfer plugin used by the tests (installed into a temporary folder)."""
