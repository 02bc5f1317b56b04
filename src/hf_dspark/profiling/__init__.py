"""Cost curves: the target's steps per second SPS(B), the drafter's cost curve, their tables."""
