"""The math: pure tensor functions, one per equation (no model, no loop)."""
