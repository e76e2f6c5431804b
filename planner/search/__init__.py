"""The search: the space a runtime runs, branch and bound over it, its brute-force twin, ranking and ties."""
