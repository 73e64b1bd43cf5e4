"""The `deferdump` command line: one module per command; `app.main` is the console-script entry point."""
