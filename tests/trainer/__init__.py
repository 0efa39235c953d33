"""Tests of driving verl's trainer: presets, settings, checks before Ray, faults, the plugin, plots (train/trainer/)."""
