"""Search-R1 + LLDS on verl 0.9.1: protocol, agent loop, reward, LLDS loss, entry point."""

import os

#: the presets (configs/*.yaml): here, so that reading them needs no verl import (train.main imports verl)
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
