"""Stand-in for simpler (the L3 worker runtime under PyPTO)."""
