"""Tests of verl components swapped inside workers: the log-prob kernel (train/workers/)."""
