"""deferdump.tools: the TLC bridge, TLA+ values, trace generation and the `deferdump` CLI."""
