"""NVRTC CPU seconds of kernel units (tools/build_stats.py --write-costs): none measured yet."""
COSTS = {}
