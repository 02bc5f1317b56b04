"""The continuous-batching engine over the DSpark round."""
