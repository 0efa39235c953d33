"""Tests of the learnable task and the run that learns on it (train/toy/)."""
