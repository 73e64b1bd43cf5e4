"""Root conftest: pytest puts this directory on sys.path, so every test imports `support.*` helpers."""
