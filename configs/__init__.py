"""The YAML configs shipped with tileinfer (default.yaml is the base of every run)."""
