"""Tests of the paper's table: engines, resume, baselines, checkpoint sweep (train/evaluation/)."""
