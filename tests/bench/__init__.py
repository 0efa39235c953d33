"""Tests of the benchmarks' own checks and the GPU check's CPU dry mode (bench/)."""
