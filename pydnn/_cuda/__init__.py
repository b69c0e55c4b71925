"""The only code in pydnn that imports cuda.bindings: driver calls (driver.py) and NVRTC (nvrtc.py)."""
