"""Kernel manifest, cubin cache, install-time build, and run-time kernel loading."""
