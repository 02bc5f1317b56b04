"""What adapts the target model to verification: ragged and static caches, packed linears and attention, checks."""
