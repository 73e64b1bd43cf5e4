"""The TLA+ model of deferred KV dumps, shipped as package data (see README.md here)."""
