"""Tests of verl's training loop on CPU: 2 ranks with the hf rollout, and verl's vLLM \
replica on vLLM's CPU build (train/cpu/)."""
