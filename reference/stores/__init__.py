"""Block stores behind the `KVStore` interface (UCM's task semantics): memory, directory, fault injection."""
