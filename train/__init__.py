"""Search-R1 + LLDS on verl 0.9.1: protocol, agent loop, reward, LLDS loss, entry point."""
