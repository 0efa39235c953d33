"""Tests of the GPU check (train/gpu_check.py, train/gpucheck/), in its CPU dry mode."""
