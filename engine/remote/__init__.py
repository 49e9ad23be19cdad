"""OpenAI-compatible servers measured from the client side, and their dialects."""
