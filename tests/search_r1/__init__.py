"""Tests of the Search-R1 task: text protocol, agent loop, reward, dataset rows (train/search_r1/)."""
