"""Versions: pydnn's own (cudnnGetVersion style), and what it runs on."""
from . import enums as E
from .status import PydnnError, api

__version__ = "0.1.0"
_MAJOR, _MINOR, _PATCH = (int(x) for x in __version__.split("."))


@api
def get_version():
    """cudnnGetVersion: MAJOR * 10000 + MINOR * 100 + PATCH (cuDNN 9's encoding)."""
    return _MAJOR * 10000 + _MINOR * 100 + _PATCH


@api
def get_cudart_version():
    """cudnnGetCudartVersion: pydnn uses no CUDA runtime; this is the driver API version
    (1000 * major + 10 * minor, e.g. 13000), or 0 where no driver is present."""
    from ._cuda import driver

    try:
        return driver.driver_version()
    except PydnnError:
        return 0


@api
def get_property(prop_type):
    """cudnnGetProperty: MAJOR_VERSION (0), MINOR_VERSION (1), PATCH_LEVEL (2)."""
    table = {0: _MAJOR, 1: _MINOR, 2: _PATCH}
    try:
        known = not isinstance(prop_type, bool) and prop_type in table
    except TypeError:  # unhashable
        known = False
    if not known:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"type: {prop_type!r} is not a libraryPropertyType value")
    return table[prop_type]
