"""Dropout (cudnnDropout*).

Not yet implemented: this module is the family's place in the package (kernel units, Python API under
__all__, C declarations in C_API), filled in by its issue."""

__all__ = []

C_API = []            # [(family title, [(C prototype, one-line description), ...])]
C_OPAQUE_TYPES = []   # [(typedef name, struct name)]
C_NULLABLE = {}       # {C function: (descriptor args that may be NULL)}


def kernel_units():
    return []
