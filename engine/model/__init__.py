"""Loading a model, the forward (eager, batched, compiled), the KV cache, the transformers fallback."""
