"""Built-in plugins. Each registers named implementations of the core's interfaces through the
``tileinfer_implementations`` hook, exactly as a third-party package would."""
