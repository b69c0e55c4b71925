"""Float64 numpy references of every pydnn primitive: the tests' oracle, usable to validate results.

Each reference takes float64 arrays holding the values actually stored on the device (round inputs with
`dtypes.round_to` first) and returns float64 results.
"""
from . import activation, dtypes  # noqa: F401
