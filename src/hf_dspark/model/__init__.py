"""The DSpark drafter model: config, modeling, heads, layers, caches, draft vocabulary."""
