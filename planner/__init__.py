"""autoplan planner (stub while the API is written)."""
