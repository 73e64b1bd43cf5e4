"""`deferdump bench` and `deferdump soak`: figures of the reference connector and the model checker."""
