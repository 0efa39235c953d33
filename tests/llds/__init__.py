"""Tests of LLDS: the penalty math, the actor loss through verl's ppo_loss, the collapse alarm (train/llds/)."""
