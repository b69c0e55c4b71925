"""Host encoding of TMA tensor maps (CUtensorMap, sm_90+) for kernels that copy tiles with
cp.async.bulk.tensor (ptx/common/tma.cuh). Owned by the matmul family (pydnn/ops/matmul.py's gemm_tma);
the attention family's warp-specialized forward encodes its 4-D maps through encode_tiled.

A map describes a row-major operand of `rows` x `cols` elements (`cols` contiguous, row pitch `ld`
elements), `batch` of them `stride` elements apart, as a 3-D tensor (cols, rows, batch), and the box one
copy moves (box_cols x box_rows x 1, the 128-byte swizzle: box_cols x element size <= 128 bytes, a box
row is one 128-byte shared-memory row). Everything but the base address is fixed per plan:
`TiledMap(...)` validates and keeps the encoding arguments (pure Python, no driver: the CPU tests check
them), and `encode(address)` asks the driver (cuTensorMapEncodeTiled: host only, no device memory, no
synchronization, so it is allowed while a stream is being captured) for the 128 bytes the kernel takes
by value. `MapCache` keeps the bytes per base address, so a plan launched again on the same buffers
re-encodes nothing.

The driver's rules (CUDA driver API, cuTensorMapEncodeTiled) checked here, so that a plan that could not
be encoded falls back to another kernel instead of failing at launch: the global address 16-byte
aligned (checked per call: `aligned`), every global stride a multiple of 16 bytes below 2^40, every
dim in [1, 2^32], box dims in [1, 256], box_cols x element size a multiple of 16 bytes and at most the
swizzle span (128 bytes).
"""
import ctypes

from .. import enums
from ..status import PydnnError

__all__ = ["TiledMap", "MapCache", "map_problem", "encode_tiled", "DTYPE_NAMES", "MAP_BYTES"]

MAP_BYTES = 128
# element size -> the CUtensorMapDataType name of pydnn's 16-bit types (by data type tag)
DTYPE_NAMES = {"f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
               "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}
ESIZE = {"f16": 2, "bf16": 2, "f32": 4}
SWIZZLE_BYTES = 128
MAX_STRIDE = 2**40
MAX_DIM = 2**32
MAX_BOX = 256


class TiledMap:
    """The encoding arguments of one operand's map (see the module docstring). Raises ValueError naming
    the rule a problem breaks (map_problem returns it as text instead)."""

    __slots__ = ("tag", "dims", "strides", "box", "esize", "l2")

    def __init__(self, tag, rows, cols, ld, batch, stride, box_cols, box_rows, l2="L2_256B"):
        why = map_problem(tag, rows, cols, ld, batch, stride, box_cols, box_rows)
        if why:
            raise ValueError(why)
        es = ESIZE[tag]
        self.tag, self.esize = tag, es
        # a single batch: its stride is never stepped; the whole matrix keeps the strides increasing
        bstride = stride if batch > 1 else rows * ld
        self.dims = (cols, rows, batch)
        self.strides = (ld * es, bstride * es)  # bytes, dims 1 and 2 (dim 0 is contiguous)
        self.box = (box_cols, box_rows, 1)
        self.l2 = l2  # CUtensorMapL2promotion: NONE, L2_64B, L2_128B, L2_256B (DRAM -> L2 fetch granularity)

    def args(self, address):
        """The positional arguments of cuTensorMapEncodeTiled after the data type, for `address` (enum
        arguments by name: interleave, swizzle, L2 promotion, out-of-bounds fill)."""
        return (DTYPE_NAMES[self.tag], 3, address, self.dims, self.strides, self.box, (1, 1, 1),
                "CU_TENSOR_MAP_INTERLEAVE_NONE", "CU_TENSOR_MAP_SWIZZLE_128B", f"CU_TENSOR_MAP_L2_PROMOTION_{self.l2}",
                "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")

    def encode(self, address):
        """The 128 bytes of the map for base `address` (16-byte aligned), from the driver."""
        return encode_tiled(self.tag, address, self.dims, self.strides, self.box, self.l2)

    def __repr__(self):
        return f"TiledMap({self.tag}, dims {self.dims}, strides {self.strides}, box {self.box})"


def encode_tiled(tag, address, dims, strides, box, l2="L2_256B", elem_strides=None):
    """cuTensorMapEncodeTiled for a tiled map of any rank (dims innermost first, element counts; strides in
    bytes of dims 1.., box in elements; element strides 1 unless given (the box then loads ceil(box[i] /
    elem_strides[i]) elements along dim i, every elem_strides[i]-th; 1..8, the innermost's ignored), no
    interleave, 128-byte swizzle, out-of-bounds elements zero): its 128 bytes. The caller has checked the
    driver's rules (map_problem for the 3-D matmul operand maps)."""
    from . import driver

    d = driver._driver()
    u64, u32 = d.cuuint64_t, d.cuuint32_t  # the bindings take these, not ints, in the arrays
    try:
        err, tmap = d.cuTensorMapEncodeTiled(
            getattr(d.CUtensorMapDataType, DTYPE_NAMES[tag]), len(dims), address, [u64(v) for v in dims],
            [u64(v) for v in strides], [u32(v) for v in box], [u32(v) for v in (elem_strides or (1,) * len(dims))],
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            getattr(d.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{l2}"),
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    except PydnnError:
        raise
    except Exception as e:  # noqa: BLE001 - no driver library with the entry point (a CPU-only machine's
        # bindings raise their own FunctionNotFoundError): the callers fall back to kernels without maps
        raise PydnnError(enums.PYDNN_STATUS_NOT_SUPPORTED,
                         f"cuTensorMapEncodeTiled unavailable: {type(e).__name__}: {e}") from e
    driver.check((err,), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), MAP_BYTES)


def map_problem(tag, rows, cols, ld, batch, stride, box_cols, box_rows):
    """Why a map of these arguments cannot be encoded (text), or None."""
    if tag not in ESIZE:
        return f"data type {tag}: no tensor map type"
    es = ESIZE[tag]
    for name, v in (("rows", rows), ("cols", cols), ("batch", batch)):
        if not 1 <= v <= MAX_DIM:
            return f"{name} {v}: a tensor map dim is in [1, 2^32]"
    if ld < cols:
        return f"ld {ld} < cols {cols}"
    if (ld * es) % 16 or ld * es >= MAX_STRIDE:
        return f"ld {ld}: the row pitch ({ld * es} bytes) must be a multiple of 16 bytes below 2^40"
    if batch > 1:
        if (stride * es) % 16 or stride * es >= MAX_STRIDE:
            return f"stride {stride}: the batch stride must be a multiple of 16 bytes below 2^40"
        if stride < rows * ld:
            return f"stride {stride}: batches overlapping or broadcast (< rows x ld = {rows * ld})"
    elif rows * ld * es >= MAX_STRIDE:
        return "the matrix spans 2^40 bytes or more"
    for name, v in (("box_cols", box_cols), ("box_rows", box_rows)):
        if not 1 <= v <= MAX_BOX:
            return f"{name} {v}: a box dim is in [1, 256]"
    if (box_cols * es) % 16 or box_cols * es > SWIZZLE_BYTES:
        return f"box_cols {box_cols}: a box row must be a multiple of 16 bytes, at most {SWIZZLE_BYTES}"
    return None


def aligned(address):
    return address % 16 == 0


class MapCache:
    """The encoded maps of one plan's operand, per base address (bounded: cleared when it fills up)."""

    __slots__ = ("map", "known", "limit")

    def __init__(self, tmap, limit=64):
        self.map, self.known, self.limit = tmap, {}, limit

    def get(self, address):
        b = self.known.get(address)
        if b is None:
            b = self.map.encode(address)
            if len(self.known) >= self.limit:
                self.known.clear()
            self.known[address] = b
        return b
