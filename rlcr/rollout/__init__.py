"""Rollouts: records (pure) and the Ray Data + vLLM generation stages."""
