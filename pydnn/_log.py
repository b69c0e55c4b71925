"""pydnn's logger: PYDNN_LOGLEVEL (error, warning [default], info, debug) and PYDNN_LOGDEST (stderr
[default], stdout, or a file path), like cuDNN's CUDNN_LOGLEVEL_DBG / CUDNN_LOGDEST_DBG."""
import logging
import os
import sys

log = logging.getLogger("pydnn")


def _configure():
    level = os.environ.get("PYDNN_LOGLEVEL", "warning").upper()
    log.setLevel(getattr(logging, level, logging.WARNING))
    dest = os.environ.get("PYDNN_LOGDEST", "stderr")
    if dest == "stderr":
        handler = logging.StreamHandler(sys.stderr)
    elif dest == "stdout":
        handler = logging.StreamHandler(sys.stdout)
    else:
        handler = logging.FileHandler(dest)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.propagate = False


_configure()
