"""The RNN family's kernels (ptx/rnn.cu): the params mirror, the manifest units and one launcher."""
import ctypes

from ..._build.manifest import KernelUnit
from ..._build.params import kernel_params
from ..._cuda import driver

THREADS = 256
BIAS_CHUNKS = 32  # row chunks of the bias gradient's first pass (bias_partial)
CTYPE = {"f32": "float", "f64": "double", "h16": "pydnn::h16_t"}
# half and bfloat16 share the h16 instantiations (ptx/common/h16.cuh: the format is RnnParams.fmt, set by the
# Launcher): one unit of 18 kernels to compile for both 16-bit types instead of two (issue 21's install time)
KTAG = {"f32": "f32", "f64": "f64", "f16": "h16", "bf16": "h16"}
FMT = {"bf16": 1}   # RnnParams.fmt of each data tag (0 otherwise: half, or not 16-bit)
MODE_ADD = 1  # PYDNN_RNN_MODE_ADD
MAXY = 8  # PYDNN_RNN_MAXY: the most rows of blocks of fwd_cell / bwd_cell / proj_commit / bwd_proj_pre (RnnParams.dir2)
PLAIN = ("proj_commit", "state_init", "state_out", "pack", "bwd_proj_pre", "bwd_state_init", "bwd_state_out", "skip_dx",
         "bias_partial", "bias_final")


DIR2 = ("xp", "hp", "bw", "br", "h_prev", "h_out", "s_prev", "s_out", "y", "act", "dy", "dxa", "dha", "gh", "ghrec",
        "gc", "dm", "aux", "aux_in")


@kernel_params("rnn_params.h", "RnnDir2")
class RnnDir2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_longlong) for n in DIR2] + [("t", ctypes.c_int), ("pad", ctypes.c_int)]


@kernel_params("rnn_params.h", "RnnParams")
class RnnParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in (
        "xp", "hp", "bw", "br", "h_prev", "h_out", "s_prev", "s_out", "y", "act", "lens", "dy", "dxa", "dha",
        "gh", "ghrec", "gc", "dm", "aux", "aux_in")] + [
        (n, ctypes.c_longlong) for n in ("ld_xp", "gs_xp", "ld_y", "rows", "ld_aux", "split_stride")] + [
        (n, ctypes.c_double) for n in ("lclip", "rclip", "fill")] + [
        (n, ctypes.c_int) for n in ("clip", "t", "batch", "hidden", "out", "seq", "vec", "layout", "cols", "mode",
                                    "nsplit", "fmt")] + [("dir2", RnnDir2 * (MAXY - 1))]


def expr(name, tag, cell=None):
    """The name expression of kernel `name` for data tag `tag` (f32 / f16 / bf16 / f64; f16 and bf16 name the
    same h16 instantiation)."""
    t = CTYPE[KTAG.get(tag, tag)]
    return f"pydnn::rnn::{name}<{t}, {cell}>" if cell is not None else f"pydnn::rnn::{name}<{t}>"


def unit_name(tag):
    return f"rnn.{KTAG.get(tag, tag)}"


def kernel_units():
    units = []
    for tag in ("f32", "h16", "f64"):
        exprs = [expr(k, tag, c) for k in ("fwd_cell", "bwd_cell") for c in range(4)]
        exprs += [expr(k, tag) for k in PLAIN]
        units.append(KernelUnit(unit_name(tag), "rnn.cu", tuple(exprs)))
    from .gemm_f64 import kernel_units as gemm_f64_units  # ptx/gemm_f64.cu (the double path's GEMMs)
    from .persist import kernel_units as persist_units  # ptx/rnn_persist.cu (PERSIST_STATIC)
    return units + gemm_f64_units() + persist_units()


class Launcher:
    """One params struct of one data type, patched per launch (pydnn/ops/rnn/engine.py's _Exec launches)."""

    def __init__(self, handle, tag):
        self.handle, self.tag = handle, tag
        self.p = RnnParams()
        self.args = driver.kernel_args(self.p)

    def reset(self):
        ctypes.memset(ctypes.addressof(self.p), 0, ctypes.sizeof(self.p))
        self.p.fmt = FMT.get(self.tag, 0)
        return self.p
