"""What this machine can do and its measured limits; the roofline."""
