"""libpydnn's C fast path: the element-wise calls (ActivationForward / Backward, AddTensor, OpTensor,
ScaleTensor, TransformTensor) repeated with the same handle and descriptors never enter Python.

The first call of a (function, handle, descriptors) goes through the embedded interpreter as every C call
does (validation, planning: pydnn/ops/_elementwise.py's launch record); on success the record is copied into
a C table here (kernels, grids, blocks, the params struct, where its pointers, scalars and flags go). A later
call that finds its record patches a copy of the params struct with its pointers and scalars, picks the
vector or scalar kernel by alignment as run_map does, and calls cuLaunchKernel: no GIL, no Python.

What keeps a record true: the records' generation (pydnn.tuning.RECORDS_GEN, an 8-byte cell in Python's
memory that C reads without the GIL), moved by every call that changes a descriptor or a handle (Set*,
Destroy*, Derive*, SetStream, a backend attribute or finalize: pydnn.status.api) and every tuning change, from C
or from Python alike; a record holds the generation its slow call started in and is used only while it is
unchanged. Calls that change nothing (a convolution, a Get*, a workspace query) leave records alone, so a C
program that interleaves other calls keeps its fast element-wise calls. (Before session 31 every other C call
bumped a C-side epoch on entry and exit: a relu after each convolution always took the slow path, and a
descriptor set from Python, libpydnn loaded in a Python process, was not seen.) A second, C-only epoch
(_pydnn_fast_bump) lets tests force the slow path. Anything the record cannot decide (a NULL pointer or scalar, a
transform whose alpha / beta changes its kernel, a failed launch) goes the slow way, which reports errors as
before. PYDNN_CHECKED=1 never installs records (its checks run in Python).
"""

# Which C functions have the fast path: C name -> op number used in the table.
FAST = {"pydnnActivationForward": 1, "pydnnActivationBackward": 2, "pydnnAddTensor": 3, "pydnnOpTensor": 4,
        "pydnnScaleTensor": 5, "pydnnTransformTensor": 6}

SLOW_PREFIX = "_pydnnSlow_"

# the record, declared once for cffi (CDEF) and the C side (C_SOURCE)
REC_STRUCT = """
typedef struct {
    int op;
    void *keys[6];
    int scalar_double, ninputs, copy_flag;
    void *vec_func, *scalar_func, *stream;
    unsigned int vec_grid[3], vec_block[3], scalar_grid[3], scalar_block[3];
    unsigned long long in_masks, out_mask;
    unsigned int base_flags, flag_beta, flags_off, nbytes, map_inputs;
    double alpha2;
    unsigned char params[1024];
} pydnn_fast_rec_t;
"""

CDEF = REC_STRUCT + """int _pydnn_fast_install(const pydnn_fast_rec_t *r, unsigned long long epoch,
                        unsigned long long local);
unsigned long long _pydnn_fast_epoch(void);
unsigned long long _pydnn_fast_local(void);
void _pydnn_fast_set_gen(void *cell);
void _pydnn_fast_bump(void);
unsigned long long _pydnn_fast_hits(void);
void _pydnn_fast_use_noop_launch(int on);
void _pydnn_fast_use_extra(int on);
int _pydnn_fast_last(void **func, unsigned int *dims, unsigned char *params, unsigned int cap);
"""

C_SOURCE = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
""" + REC_STRUCT + r"""
typedef int (*pydnn_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              void *, void **, void **);
#define PYDNN_FAST_SLOTS 256
typedef struct {
    volatile uint64_t seq;  /* odd while written (seqlock; writers hold the GIL) */
    uint64_t epoch, local;  /* the records' generation its slow call started in; the C-only epoch then */
    pydnn_fast_rec_t r;
} pydnn_fast_slot_t;
static pydnn_fast_slot_t pydnn_fast_table[PYDNN_FAST_SLOTS];
/* the records' generation: pydnn.tuning.RECORDS_GEN once the init code gave its address (_pydnn_fast_set_gen);
   until then a cell of ours that nothing moves, with no record installed (install needs the address) */
static volatile uint64_t pydnn_fast_gen0 = 1;
static volatile uint64_t *pydnn_fast_gen = &pydnn_fast_gen0;
static int pydnn_fast_gen_set;
static volatile uint64_t pydnn_fast_epoch_v = 1;  /* C-only: _pydnn_fast_bump (tests) */
static volatile uint64_t pydnn_fast_hits_v;
static pydnn_launch_t pydnn_cu_launch;
static int pydnn_noop_launches;

/* tests without a GPU: a launch that keeps what it was given (_pydnn_fast_last reads it back) */
static void *pydnn_last_func;
static unsigned pydnn_last_dims[7];
static unsigned char pydnn_last_params[1024];
static unsigned pydnn_last_nbytes, pydnn_pending_nbytes;
static int pydnn_noop_launch(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g,
                             unsigned s, void *st, void **p, void **x) {
    (void)st;
    pydnn_last_func = f;
    unsigned dims[7] = {a, b, c, d, e, g, s};
    memcpy(pydnn_last_dims, dims, sizeof dims);
    pydnn_last_nbytes = pydnn_pending_nbytes;
    /* the parameter block as kernelParams[0], or through extra (BUFFER_POINTER, ptr, BUFFER_SIZE, &size, END) */
    const void *src = p ? p[0] : x ? x[1] : NULL;
    if (!src || (!p && *(const size_t *)x[3] != pydnn_last_nbytes)) return 1;
    memcpy(pydnn_last_params, src, pydnn_last_nbytes);
    return 0;
}
int _pydnn_fast_last(void **func, unsigned int *dims, unsigned char *params, unsigned int cap) {
    *func = pydnn_last_func;
    memcpy(dims, pydnn_last_dims, sizeof pydnn_last_dims);
    unsigned n = pydnn_last_nbytes < cap ? pydnn_last_nbytes : cap;
    memcpy(params, pydnn_last_params, n);
    return (int)n;
}

static unsigned pydnn_fast_index(int op, void *const *k) {
    uintptr_t h = (uintptr_t)op * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 6; i++) h = (h ^ (uintptr_t)k[i]) * 0x100000001B3ull;
    return (unsigned)((h >> 17) % PYDNN_FAST_SLOTS);
}

unsigned long long _pydnn_fast_epoch(void) { return __atomic_load_n(pydnn_fast_gen, __ATOMIC_ACQUIRE); }
void _pydnn_fast_set_gen(void *cell) {
    if (!cell) return;
    pydnn_fast_gen = (volatile uint64_t *)cell;
    pydnn_fast_gen_set = 1;
}
void _pydnn_fast_bump(void) { __atomic_add_fetch(&pydnn_fast_epoch_v, 1, __ATOMIC_ACQ_REL); }
unsigned long long _pydnn_fast_hits(void) { return pydnn_fast_hits_v; }
void _pydnn_fast_use_noop_launch(int on) { pydnn_noop_launches = on; }
/* 1: pass the parameter block through cuLaunchKernel's `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE)
   instead of kernelParams; the same bytes reach the kernel (tests/c/bench_host.c times both) */
static int pydnn_fast_extra;
void _pydnn_fast_use_extra(int on) { pydnn_fast_extra = on; }

unsigned long long _pydnn_fast_local(void) { return __atomic_load_n(&pydnn_fast_epoch_v, __ATOMIC_ACQUIRE); }

int _pydnn_fast_install(const pydnn_fast_rec_t *r, unsigned long long epoch, unsigned long long local) {
    if (r->nbytes > sizeof r->params || r->map_inputs > 4) return 0;
    if (!pydnn_cu_launch) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (lib) pydnn_cu_launch = (pydnn_launch_t)dlsym(lib, "cuLaunchKernel");
    }
    if (!pydnn_cu_launch && !pydnn_noop_launches) return 0;
    if (!pydnn_fast_gen_set) return 0;
    pydnn_fast_slot_t *s = &pydnn_fast_table[pydnn_fast_index(r->op, r->keys)];
    __atomic_add_fetch(&s->seq, 1, __ATOMIC_ACQ_REL);
    memcpy(&s->r, r, sizeof *r);
    s->epoch = epoch;
    s->local = local;
    __atomic_add_fetch(&s->seq, 1, __ATOMIC_ACQ_REL);
    return 1;
}

/* 0: launched; -1: no usable record (the caller takes the slow path). */
static int pydnn_fast_map(int op, void *k0, void *k1, void *k2, void *k3, void *k4, void *k5, const void *alpha,
                          const void *beta, const void *alpha2p, void *out, const void *i0, const void *i1,
                          const void *i2, int transform) {
    void *keys[6] = {k0, k1, k2, k3, k4, k5};
    pydnn_fast_slot_t *s = &pydnn_fast_table[pydnn_fast_index(op, keys)];
    uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    if (seq & 1 || s->r.op != op || memcmp(s->r.keys, keys, sizeof keys)) return -1;
    if (s->epoch != __atomic_load_n(pydnn_fast_gen, __ATOMIC_ACQUIRE) ||
        s->local != __atomic_load_n(&pydnn_fast_epoch_v, __ATOMIC_ACQUIRE))
        return -1;
    if (!alpha || !beta || !out || !i0 || (s->r.ninputs > 1 && !i1) || (s->r.ninputs > 2 && !i2)) return -1;
    unsigned char p[1024];
    pydnn_fast_rec_t r;
    memcpy(&r, &s->r, offsetof(pydnn_fast_rec_t, params));
    if (r.nbytes > sizeof p) return -1;
    memcpy(p, s->r.params, r.nbytes);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != seq) return -1;
    double al, be, a2 = r.alpha2;
    if (r.scalar_double) {
        al = *(const double *)alpha; be = beta == (const void *)-1 ? 0.0 : *(const double *)beta;
        if (alpha2p) a2 = *(const double *)alpha2p;
    } else {
        al = *(const float *)alpha; be = beta == (const void *)-1 ? 0.0 : *(const float *)beta;
        if (alpha2p) a2 = *(const float *)alpha2p;
    }
    if (transform && ((al == 1.0 && be == 0.0) ? 1 : 0) != r.copy_flag) return -1;
    uint64_t o = (uintptr_t)out, a = (uintptr_t)i0, b = (uintptr_t)i1, c = (uintptr_t)i2;
    if (r.ninputs < 2) b = 0;
    if (r.ninputs < 3) c = 0;
    uint64_t ptrs[4] = {a, b, c, 0}, mask = a | b | c;
    memcpy(p, &o, 8);
    for (unsigned k = 0; k < r.map_inputs; k++) memcpy(p + 8 + 8 * k, &ptrs[k], 8);
    size_t sc = 8 + 8 * (size_t)r.map_inputs;
    memcpy(p + sc, &al, 8);
    memcpy(p + sc + 8, &a2, 8);
    memcpy(p + sc + 16, &be, 8);
    uint32_t flags = r.base_flags | (be != 0.0 ? r.flag_beta : 0);
    memcpy(p + r.flags_off, &flags, 4);
    void *argv[1] = {p};
    size_t psize = r.nbytes;
    void *extra[5] = {(void *)1 /* CU_LAUNCH_PARAM_BUFFER_POINTER */, p, (void *)2 /* CU_LAUNCH_PARAM_BUFFER_SIZE */,
                      &psize, (void *)0 /* CU_LAUNCH_PARAM_END */};
    int vec = (mask & r.in_masks) == 0 && (o & r.out_mask) == 0;
    const unsigned *g = vec ? r.vec_grid : r.scalar_grid, *bl = vec ? r.vec_block : r.scalar_block;
    pydnn_launch_t launch = pydnn_cu_launch;
    if (pydnn_noop_launches) {
        launch = pydnn_noop_launch;
        pydnn_pending_nbytes = r.nbytes;
    }
    if (!launch) return -1;
    if (launch(vec ? r.vec_func : r.scalar_func, g[0], g[1], g[2], bl[0], bl[1], bl[2], 0, r.stream,
               pydnn_fast_extra ? NULL : argv, pydnn_fast_extra ? extra : NULL))
        return -1; /* the slow path launches again and reports the driver's error */
    __atomic_add_fetch(&pydnn_fast_hits_v, 1, __ATOMIC_RELAXED);
    return 0;
}

#define PYDNN_FAST_EXPORT __attribute__((visibility("default")))

PYDNN_FAST_EXPORT pydnnStatus_t pydnnActivationForward(pydnnHandle_t handle, pydnnActivationDescriptor_t activationDesc,
        const void *alpha, const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta,
        const pydnnTensorDescriptor_t yDesc, void *y) {
    if (pydnn_fast_map(1, handle, activationDesc, xDesc, yDesc, NULL, NULL, alpha, beta, NULL, y, x, NULL, NULL, 0) == 0)
        return PYDNN_STATUS_SUCCESS;
    return _pydnnSlow_ActivationForward(handle, activationDesc, alpha, xDesc, x, beta, yDesc, y);
}

PYDNN_FAST_EXPORT pydnnStatus_t pydnnActivationBackward(pydnnHandle_t handle, pydnnActivationDescriptor_t activationDesc,
        const void *alpha, const pydnnTensorDescriptor_t yDesc, const void *y, const pydnnTensorDescriptor_t dyDesc,
        const void *dy, const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta,
        const pydnnTensorDescriptor_t dxDesc, void *dx) {
    if (pydnn_fast_map(2, handle, activationDesc, yDesc, dyDesc, xDesc, dxDesc, alpha, beta, NULL, dx, dy, y, x,
                       0) == 0)
        return PYDNN_STATUS_SUCCESS;
    return _pydnnSlow_ActivationBackward(handle, activationDesc, alpha, yDesc, y, dyDesc, dy, xDesc, x, beta,
                                         dxDesc, dx);
}

PYDNN_FAST_EXPORT pydnnStatus_t pydnnAddTensor(pydnnHandle_t handle, const void *alpha,
        const pydnnTensorDescriptor_t aDesc, const void *A, const void *beta, const pydnnTensorDescriptor_t cDesc,
        void *C) {
    if (pydnn_fast_map(3, handle, aDesc, cDesc, NULL, NULL, NULL, alpha, beta, NULL, C, A, NULL, NULL, 0) == 0)
        return PYDNN_STATUS_SUCCESS;
    return _pydnnSlow_AddTensor(handle, alpha, aDesc, A, beta, cDesc, C);
}

PYDNN_FAST_EXPORT pydnnStatus_t pydnnOpTensor(pydnnHandle_t handle, const pydnnOpTensorDescriptor_t opTensorDesc,
        const void *alpha1, const pydnnTensorDescriptor_t aDesc, const void *A, const void *alpha2,
        const pydnnTensorDescriptor_t bDesc, const void *B, const void *beta, const pydnnTensorDescriptor_t cDesc,
        void *C) {
    if (alpha2 && pydnn_fast_map(4, handle, opTensorDesc, aDesc, bDesc, cDesc, NULL, alpha1, beta, alpha2, C, A, B, NULL, 0) == 0)
        return PYDNN_STATUS_SUCCESS;
    return _pydnnSlow_OpTensor(handle, opTensorDesc, alpha1, aDesc, A, alpha2, bDesc, B, beta, cDesc, C);
}

PYDNN_FAST_EXPORT pydnnStatus_t pydnnScaleTensor(pydnnHandle_t handle, const pydnnTensorDescriptor_t yDesc, void *y,
        const void *alpha) {
    if (pydnn_fast_map(5, handle, yDesc, NULL, NULL, NULL, NULL, alpha, (const void *)-1, NULL, y, y, NULL, NULL, 0) == 0)
        return PYDNN_STATUS_SUCCESS;
    return _pydnnSlow_ScaleTensor(handle, yDesc, y, alpha);
}

PYDNN_FAST_EXPORT pydnnStatus_t pydnnTransformTensor(pydnnHandle_t handle, const void *alpha,
        const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta, const pydnnTensorDescriptor_t yDesc,
        void *y) {
    if (pydnn_fast_map(6, handle, xDesc, yDesc, NULL, NULL, NULL, alpha, beta, NULL, y, x, NULL, NULL, 1) == 0)
        return PYDNN_STATUS_SUCCESS;
    return _pydnnSlow_TransformTensor(handle, alpha, xDesc, x, beta, yDesc, y);
}
"""


def slow_name(c_name):
    return SLOW_PREFIX + c_name[len("pydnn"):]


def embedding_prototypes(prototypes):
    """The embedding API's prototypes: the fast-path functions renamed to their slow (Python) halves."""
    out = []
    for proto in prototypes:
        for c_name in FAST:
            if f" {c_name}(" in proto:
                proto = proto.replace(f" {c_name}(", f" {slow_name(c_name)}(")
                break
        out.append(proto)
    return out


# ---------------------------------------------------------------- the Python half (inside libpydnn)

def _record_of(c_name, args):
    """The launch record the Python call just used (pydnn/ops/_elementwise.py's Prepared) and its C keys'
    Python objects, or None when the call has no single cached map record."""
    import pydnn
    from pydnn.ops import _elementwise as ew
    from pydnn.ops import activation, tensor_ops

    h = args[0]
    if c_name == "pydnnActivationForward":
        key = activation._key(0, args[1], (args[3], args[6]))
    elif c_name == "pydnnActivationBackward":
        key = activation._key(1, args[1], (args[10], args[5], args[3], args[7]))
    elif c_name == "pydnnAddTensor":
        key = ew.desc_key("add", args[2], args[5])
    elif c_name == "pydnnOpTensor":
        unary = getattr(args[1], "op", None) in tensor_ops.UNARY
        key = ew.desc_key("op", args[1], args[3], args[9], None if unary else args[6])
    elif c_name == "pydnnScaleTensor":
        key = ew.desc_key("scale", args[1])
    elif c_name == "pydnnTransformTensor":
        return None  # its record is keyed by alpha / beta too: see install()
    else:
        return None
    if key is None or not isinstance(h, pydnn.handle.Handle):
        return None
    return h.prepared.get(key)


def install(ffi, lib, c_name, cargs, args, epoch, local, transform_copy=None):
    """Copy the record of a successful slow call into libpydnn's table (see the module docstring)."""
    from pydnn import buffers, enums as E
    from pydnn.ops import _elementwise as ew

    if buffers.CHECKED:
        return False
    if c_name == "pydnnTransformTensor":
        al, be, xd, yd = args[1], args[4], args[2], args[5]
        copy = al == 1.0 and be == 0.0 and getattr(xd, "dtype", None) == getattr(yd, "dtype", 0)
        key = ew.desc_key("transform", copy, xd, yd)
        rec = args[0].prepared.get(key) if key is not None else None
        copy_flag = 1 if copy else 0
        if rec is not None and not copy and al == 1.0 and be == 0.0:
            return False  # dtypes differ: the C side cannot tell copy from scaled by alpha / beta alone
    else:
        rec = _record_of(c_name, args)
        copy_flag = 0
    if rec is None or not hasattr(rec, "vec_func"):
        return False
    from pydnn._build.params import FLAG_BETA, MAP_INPUTS

    r = ffi.new("pydnn_fast_rec_t *")
    r.op = FAST[c_name]
    keys = {"pydnnActivationForward": (0, 1, 3, 6), "pydnnActivationBackward": (0, 1, 3, 5, 7, 10),
            "pydnnAddTensor": (0, 2, 5), "pydnnOpTensor": (0, 1, 3, 6, 9), "pydnnScaleTensor": (0, 1),
            "pydnnTransformTensor": (0, 2, 5)}[c_name]
    for j, i in enumerate(keys):
        r.keys[j] = cargs[i]
    out_desc = args[{"pydnnActivationForward": 6, "pydnnActivationBackward": 10, "pydnnAddTensor": 5,
                     "pydnnOpTensor": 9, "pydnnScaleTensor": 1, "pydnnTransformTensor": 5}[c_name]]
    r.scalar_double = 1 if getattr(out_desc, "dtype", None) == E.PYDNN_DATA_DOUBLE else 0
    r.ninputs = rec.ninputs
    if c_name == "pydnnScaleTensor":
        r.ninputs = 1
    r.copy_flag = copy_flag
    r.vec_func = ffi.cast("void *", int(rec.vec_func))
    r.scalar_func = ffi.cast("void *", int(rec.scalar_func))
    r.stream = ffi.cast("void *", int(args[0].stream))
    r.vec_grid, r.vec_block = list(rec.vec_grid), list(rec.vec_block)
    r.scalar_grid, r.scalar_block = list(rec.scalar_grid), list(rec.block)
    r.in_masks, r.out_mask = rec.in_masks, rec.out_mask
    r.base_flags, r.flag_beta, r.flags_off = rec.base_flags, FLAG_BETA, ew._FLAGS_AT
    raw = bytes(rec.params)
    r.nbytes, r.map_inputs = len(raw), MAP_INPUTS
    from pydnn.ops.activation import _UNUSED_ALPHA2

    r.alpha2 = _UNUSED_ALPHA2 if c_name.startswith("pydnnActivation") else 0.0
    if len(raw) > 1024:
        return False
    ffi.memmove(r.params, raw, len(raw))
    return bool(lib._pydnn_fast_install(r, epoch, local))
