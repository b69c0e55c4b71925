"""Op families: each module validates its arguments, chooses a kernel variant and launches it."""
