"""Statuses, PydnnError, and the per-thread last-error string.

Every public call is wrapped by `api`: a failure becomes a `PydnnError` carrying a cuDNN status and a
message that names the argument and the reason; the message is also kept per thread for
`get_last_error_string` (the C face returns the status and the same message).
"""
import functools
import threading

from . import enums
from .tuning import RECORDS_GEN, _records_count

_STATUS_NAMES = {}
for _name, _value in enums.ENUMS["pydnnStatus_t"].items():
    _STATUS_NAMES.setdefault(_value, _name)  # first name wins over later aliases

_tls = threading.local()


class PydnnError(Exception):
    """A failed pydnn call: `status` is a PYDNN_STATUS_* value, `message` says which argument and why."""

    def __init__(self, status, message):
        super().__init__(f"{_STATUS_NAMES.get(status, status)}: {message}")
        self.status = status
        self.message = message


def get_error_string(status):
    """cudnnGetErrorString: the constant's name for a status, or an 'unknown' text."""
    try:
        status = int(status)
    except (TypeError, ValueError):
        return "PYDNN_STATUS_UNKNOWN"
    return _STATUS_NAMES.get(status, "PYDNN_STATUS_UNKNOWN")


def get_last_error_string():
    """cudnnGetLastErrorString: the message of the last failed call on this thread ('' if none)."""
    return getattr(_tls, "last", "")


def set_last_error(message):
    _tls.last = message


def bad_param(message, status=enums.PYDNN_STATUS_BAD_PARAM):
    raise PydnnError(status, message)


def not_supported(message, status=enums.PYDNN_STATUS_NOT_SUPPORTED):
    raise PydnnError(status, message)


def _misuse(fn, args, kwargs):
    """True when calling `fn` with these arguments fails at binding (wrong argument count, an unknown or
    repeated keyword): the call never entered `fn`, so the TypeError is the caller's, not pydnn's.
    Only reached on the error path, so its cost (a signature bind) is never paid by a successful call."""
    import inspect

    try:
        sig = _signatures.get(fn)
        if sig is None:
            sig = _signatures[fn] = inspect.signature(fn)
        sig.bind(*args, **kwargs)
    except TypeError:
        return True
    except ValueError:  # no signature (never for pydnn's Python functions): not provably misuse
        return False
    return False


_signatures = {}


# Public functions that change a descriptor or a handle (cuDNN's Set* / Destroy* and their kin): api() makes
# them bump tuning.RECORDS_GEN, which records kept outside Python's caches (libpydnn's C fast path, the
# compiled activation entry) compare against. set_tensor writes a tensor's values, not a descriptor.
_MUTATOR_PREFIXES = ("set_", "destroy", "derive_", "restore_", "backend_set_", "backend_finalize",
                     "backend_destroy", "rnn_set_", "build_rnn_")
_NOT_MUTATORS = frozenset({"set_tensor"})


def mutates(name):
    """Whether the public function `name` changes a descriptor or a handle (see _MUTATOR_PREFIXES)."""
    return name.startswith(_MUTATOR_PREFIXES) and name not in _NOT_MUTATORS


def api(fn):
    """Mark a public API function: record its failure as the thread's last error, prefixed with its name.

    Three outcomes besides success:
    - pydnn's own checks raise PydnnError (a status and a message naming the argument): re-raised as is;
    - Python-level misuse of the function itself (wrong number of arguments, a misspelt keyword) raises
      Python's own TypeError, unchanged, as calling any Python function would (the C face never does this:
      its marshalling always passes the declared arguments);
    - anything else escaping an API function is a pydnn bug; it still becomes a status (INTERNAL_ERROR, or
      ALLOC_FAILED for a MemoryError), chained to the original exception, so that a C caller gets a code and
      a message instead of a crash.
    """
    name = fn.__name__
    # a function that changes a descriptor or a handle moves the records' generation (tuning.RECORDS_GEN) after
    # the call, failed or not (a failed Set may have changed part of a descriptor); inline, not a
    # bump_records() call: no Python frame more a Set (tests/hard/test_call_path_cpu bounds the C face's work)
    mut = mutates(name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PydnnError as e:
            set_last_error(f"{name}: {e.message}")
            raise
        except TypeError as e:
            if _misuse(fn, args, kwargs):
                set_last_error(f"{name}: {e}")
                raise
            msg = f"{name}: internal error: {type(e).__name__}: {e}"
            set_last_error(msg)
            raise PydnnError(enums.PYDNN_STATUS_INTERNAL_ERROR, msg) from e
        except MemoryError as e:
            msg = f"{name}: host allocation failed: {e or 'MemoryError'}"
            set_last_error(msg)
            raise PydnnError(enums.PYDNN_STATUS_ALLOC_FAILED, msg) from e
        except Exception as e:  # noqa: BLE001 - turned into a status on purpose
            msg = f"{name}: internal error: {type(e).__name__}: {e}"
            set_last_error(msg)
            raise PydnnError(enums.PYDNN_STATUS_INTERNAL_ERROR, msg) from e
        finally:
            if mut:
                RECORDS_GEN[0] = next(_records_count)

    wrapper.__pydnn_api__ = True
    return wrapper
