"""Weight variants: their build, bytes and measured quality."""
