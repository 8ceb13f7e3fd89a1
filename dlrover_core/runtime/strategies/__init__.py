"""Training strategies: ``ps`` (parameter servers + asynchronous workers)."""
