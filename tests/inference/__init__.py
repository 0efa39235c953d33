"""Tests of answering outside training: infer.py, the hf engine and its caches, engine faults (train/inference/)."""
