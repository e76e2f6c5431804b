"""Plans as data: the plan file (read, written, versioned), the report, its rendering and its bands."""
