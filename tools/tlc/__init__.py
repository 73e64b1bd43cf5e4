"""The TLC bridge: find Java and the pinned jar, run TLC, parse its `-tool` output, TLA+ values and cfg text,
and check manifest models against their expectations. Imports only `deferdump.reference` (for the error root)."""
