"""The worker and scheduler, the decode loop, sampling, detokenizing, the prefix cache, sessions."""
