"""A compiled launch path (a small CPython extension, built on first use): element-wise launch records
(pydnn/ops/_elementwise.py's run_map) and replayed plans (pydnn/ops/_replay.py).

run_map's per-call work - writing the pointers, scalars and flags into the record's params struct, picking
the vector or the scalar kernel by alignment, and cuLaunchKernel - is one C call: map_launch(record, stream,
out, in0, in1, in2, alpha, alpha2, beta, n); a replayed plan's launches and copies are one call too
(launch_items); so is a generated graph kernel's launch with its pointers patched (patch_launch, the graph's
PwStep) and activation_forward's whole cached call (act_fwd: the checks of the Python function's cached
path, torch tensors read through their own methods, the launch; it declines anything else to Python). The driver's own entry points are dlsym'ed from the libcuda cuda.bindings loaded. On the
H200 cuda.bindings' cuLaunchKernel alone measured 4.2 us per launch from Python (bench_host.py's launch row),
about half of it its wrapper.

Compiled with the C compiler Python was built with (no cffi: the GPU machines have none by default) into
the cache (<cache>/lib/<python tag>/), keyed by the source, on first use (one log line, about a second);
without a compiler, Python headers or libcuda, or with tuning.callpath.C_LAUNCH off, launches go through
driver.launch_args as before. Launches made while driver.launch_args is replaced (tests) or while a plan
is being recorded take the Python path too (the callers check).
"""
import ctypes
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

from .._cuda import driver
from .cache import cache_dir

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t params, argv, vec_func, scalar_func;
    uint32_t vec_grid[3], vec_block[3], scalar_grid[3], scalar_block[3];
    uint64_t in_masks, out_mask;
    uint32_t base_flags, flag_beta, flags_off, map_inputs;
} pydnn_map_rec_t;

/* one recorded launch (kind 0) or device-to-device copy (kind 1) of a replayed plan (pydnn/ops/_replay.py) */
typedef struct {
    uint64_t kind, func, argv, smem;
    uint32_t grid[3], block[3];
    uint64_t dst, src, nbytes;
} pydnn_item_t;

typedef int (*pydnn_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              void *, void **, void **);
typedef int (*pydnn_copy_t)(uint64_t, uint64_t, size_t, void *);
static pydnn_launch_t cu_launch;
static pydnn_copy_t cu_copy;

static PyObject *fc_init(PyObject *self, PyObject *unused) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib) {
        cu_launch = (pydnn_launch_t)dlsym(lib, "cuLaunchKernel");
        cu_copy = (pydnn_copy_t)dlsym(lib, "cuMemcpyDtoDAsync_v2");
    }
    return PyBool_FromLong(cu_launch != NULL);
}

static int u64(PyObject *o, uint64_t *v) {
    unsigned long long x = PyLong_AsUnsignedLongLong(o);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *v = x;
    return 0;
}

static int map_core(uint64_t rec, uint64_t stream, uint64_t o, const uint64_t *ins, long n, double alpha,
                    double alpha2, double beta) {
    const pydnn_map_rec_t *r = (const pydnn_map_rec_t *)(uintptr_t)rec;
    unsigned char *p = (unsigned char *)(uintptr_t)r->params;
    uint64_t mask = n == 0 ? 0 : n == 1 ? ins[0] : n == 2 ? (ins[0] | ins[1]) : (ins[0] | ins[1] | ins[2]);
    memcpy(p, &o, 8);
    for (unsigned k = 0; k < r->map_inputs && k < 3; k++) memcpy(p + 8 + 8 * k, &ins[k], 8);
    size_t sc = 8 + 8 * (size_t)r->map_inputs;
    memcpy(p + sc, &alpha, 8);
    memcpy(p + sc + 8, &alpha2, 8);
    memcpy(p + sc + 16, &beta, 8);
    uint32_t flags = r->base_flags | (beta != 0.0 ? r->flag_beta : 0);
    memcpy(p + r->flags_off, &flags, 4);
    int vec = (mask & r->in_masks) == 0 && (o & r->out_mask) == 0;
    const uint32_t *g = vec ? r->vec_grid : r->scalar_grid, *b = vec ? r->vec_block : r->scalar_block;
    return cu_launch((void *)(uintptr_t)(vec ? r->vec_func : r->scalar_func), g[0], g[1], g[2], b[0], b[1], b[2], 0,
                     (void *)(uintptr_t)stream, (void **)(uintptr_t)r->argv, NULL);
}

/* map_launch(rec, stream, out, in0, in1, in2, alpha, alpha2, beta, n) -> the driver's status: run_map's
   patch (out, in[map_inputs], alpha, alpha2, beta at the start of the params struct; flags at flags_off),
   vector / scalar choice by alignment, and cuLaunchKernel. */
static PyObject *fc_map_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "map_launch takes 10 arguments");
        return NULL;
    }
    uint64_t rec, stream, o, ins[3];
    if (u64(args[0], &rec) || u64(args[1], &stream) || u64(args[2], &o) || u64(args[3], &ins[0]) ||
        u64(args[4], &ins[1]) || u64(args[5], &ins[2]))
        return NULL;
    double alpha = PyFloat_AsDouble(args[6]), alpha2 = PyFloat_AsDouble(args[7]), beta = PyFloat_AsDouble(args[8]);
    long n = PyLong_AsLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(map_core(rec, stream, o, ins, n, alpha, alpha2, beta));
}

/* launch_items(items, count, stream) -> (status, index of the failing item or -1) */
static PyObject *fc_launch_items(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "launch_items takes 3 arguments");
        return NULL;
    }
    uint64_t items, count, stream;
    if (u64(args[0], &items) || u64(args[1], &count) || u64(args[2], &stream)) return NULL;
    const pydnn_item_t *it = (const pydnn_item_t *)(uintptr_t)items;
    for (uint64_t i = 0; i < count; i++) {
        int err;
        if (it[i].kind == 0)
            err = cu_launch((void *)(uintptr_t)it[i].func, it[i].grid[0], it[i].grid[1], it[i].grid[2], it[i].block[0],
                            it[i].block[1], it[i].block[2], (unsigned)it[i].smem, (void *)(uintptr_t)stream,
                            (void **)(uintptr_t)it[i].argv, NULL);
        else
            err = cu_copy ? cu_copy(it[i].dst, it[i].src, (size_t)it[i].nbytes, (void *)(uintptr_t)stream) : 1;
        if (err) return Py_BuildValue("(iK)", err, (unsigned long long)i);
    }
    return Py_BuildValue("(iL)", 0, -1LL);
}

/* launch(func, gx, gy, gz, bx, by, bz, smem, stream, argv) -> the driver's status (driver.launch_args) */
static PyObject *fc_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "launch takes 10 arguments");
        return NULL;
    }
    uint64_t v[10];
    for (int i = 0; i < 10; i++)
        if (u64(args[i], &v[i])) return NULL;
    int err = cu_launch((void *)(uintptr_t)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                        (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], (void *)(uintptr_t)v[8],
                        (void **)(uintptr_t)v[9], NULL);
    return PyLong_FromLong(err);
}

/* one launch of a kernel whose single parameter struct takes pointers at fixed offsets (pydnn/graph/engines.py's
   PwStep): patch_launch(rec, stream, ptrs, uids) writes ptrs[uids[k]] (ptrs a dict of ints, uids a tuple) at
   ptr_off[k] of the struct; with vec set, the flags word at flags_off becomes 1 when the OR of the pointers
   selected by vec_sel has no bit of vec_mask in common, else 0; then cuLaunchKernel. Returns the driver's
   status (a missing uid: KeyError, as the dict lookup in Python). */
typedef struct {
    uint64_t func, argv, params;
    uint32_t grid[3], block[3];
    uint32_t smem, nptr, flags_off, vec;
    uint64_t vec_mask, vec_sel;
    uint32_t ptr_off[16];
} pydnn_patch_rec_t;

static PyObject *fc_patch_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[2]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "patch_launch takes (rec, stream, dict, tuple)");
        return NULL;
    }
    uint64_t rec, stream;
    if (u64(args[0], &rec) || u64(args[1], &stream)) return NULL;
    const pydnn_patch_rec_t *r = (const pydnn_patch_rec_t *)(uintptr_t)rec;
    Py_ssize_t n = PyTuple_GET_SIZE(args[3]);
    if (n != (Py_ssize_t)r->nptr || n > 16) {
        PyErr_SetString(PyExc_TypeError, "patch_launch: the uids do not match the record");
        return NULL;
    }
    unsigned char *p = (unsigned char *)(uintptr_t)r->params;
    uint64_t bits = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *key = PyTuple_GET_ITEM(args[3], k);
        PyObject *v = PyDict_GetItemWithError(args[2], key);
        uint64_t x;
        if (!v) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
            return NULL;
        }
        if (u64(v, &x)) return NULL;
        memcpy(p + r->ptr_off[k], &x, 8);
        if ((r->vec_sel >> k) & 1) bits |= x;
    }
    if (r->vec) {
        uint32_t f = (bits & r->vec_mask) ? 0 : 1;
        memcpy(p + r->flags_off, &f, 4);
    }
    int err = cu_launch((void *)(uintptr_t)r->func, r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1],
                        r->block[2], r->smem, (void *)(uintptr_t)stream, (void **)(uintptr_t)r->argv, NULL);
    return PyLong_FromLong(err);
}

/* activation_forward's cached call answered here (pydnn/ops/activation.py's entry): the same checks, in the
   same order, as the Python function's cached path - a live pydnn Handle, the launch record under the key
   (0, activationDesc, its version, xDesc, its version, yDesc, its version) in handle.prepared with a compiled
   record (crec), float alpha / beta, driver.launch_args not replaced and no recording, PYDNN_CHECKED off,
   and each buffer a positive int or a torch.Tensor (buffers.TORCH_TENSOR) that is CUDA memory, contiguous,
   at least the record's span and not NULL - then run_map's patch and launch. Returns None once launched;
   False for anything else (the caller runs the Python function, which decides and reports errors, and
   launches again after a failed launch to report the driver's error). Never raises.

   The handle / key / record part is remembered per call site: a slot (by the descriptors' addresses) holds
   the handle, the three descriptors and the record (strong references, so no address is reused while
   held), the compiled record, the stream and the spans, and the records' generation (pydnn.tuning.RECORDS_GEN)
   read before they were looked up. While the generation is unchanged no descriptor was Set or Destroyed, no
   handle destroyed or given a stream and no switch changed (status.api / tuning bump it), so the lookups
   would give the same answer: a call that finds its slot skips them (alive, three versions, the key tuple,
   prepared, crec, need, stream: ~15 attribute reads and a 7-tuple hash). */
static PyObject *act_handle_type, *act_driver, *act_launch_args, *act_buffers, *act_zero, *act_driver_dict,
    *act_buffers_dict;
static double act_alpha2;
static PyObject *act_cupy_type; /* buffers.CUPY_ARRAY as last read (borrowed from the module's dict) */
static volatile uint64_t *act_gen;
static uint64_t act_hits;
static PyObject *s_alive, *s_version, *s_prepared, *s_crec, *s_need, *s_stream, *s_launch_args, *s_recorders,
    *s_checked, *s_torch, *s_is_cuda, *s_nbytes, *s_is_contiguous, *s_data_ptr, *s_cupy, *s_data, *s_ptr, *s_flags,
    *s_c_contiguous;

#define ACT_SLOTS 16
typedef struct {
    PyObject *h, *a, *xd, *yd, *rec;  /* strong references; NULL: empty */
    uint64_t gen, crec, stream;
    long long need_x, need_y;
} act_slot_t;
static act_slot_t act_slots[ACT_SLOTS];

static unsigned act_index(PyObject *a, PyObject *xd, PyObject *yd) {
    uintptr_t k = ((uintptr_t)a >> 4) ^ ((uintptr_t)xd >> 6) ^ ((uintptr_t)yd >> 8);
    return (unsigned)((k ^ (k >> 11)) % ACT_SLOTS);
}

static void act_clear_slots(void) {
    for (int i = 0; i < ACT_SLOTS; i++) {
        act_slot_t *sl = &act_slots[i];
        Py_CLEAR(sl->h); Py_CLEAR(sl->a); Py_CLEAR(sl->xd); Py_CLEAR(sl->yd); Py_CLEAR(sl->rec);
    }
}

/* act_setup(Handle, driver, launch_args, buffers, alpha2[, address of the records' generation]) */
static PyObject *fc_act_setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "act_setup takes 5 or 6 arguments");
        return NULL;
    }
    double a2 = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    uint64_t gen_addr = 0;
    if (nargs == 6 && u64(args[5], &gen_addr)) return NULL;
    PyObject *dd = PyObject_GenericGetDict(args[1], NULL), *bd = PyObject_GenericGetDict(args[3], NULL);
    if (!dd || !bd || !PyDict_Check(dd) || !PyDict_Check(bd)) {
        Py_XDECREF(dd); Py_XDECREF(bd);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "act_setup: modules expected");
        return NULL;
    }
    Py_XSETREF(act_driver_dict, dd);
    Py_XSETREF(act_buffers_dict, bd);
    PyObject **slots[] = {&act_handle_type, &act_driver, &act_launch_args, &act_buffers};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    act_alpha2 = a2;
    act_gen = gen_addr ? (volatile uint64_t *)(uintptr_t)gen_addr : NULL;
    act_clear_slots();
    if (!act_zero) act_zero = PyLong_FromLong(0);
#define INTERN(v, t) if (!v && !(v = PyUnicode_InternFromString(t))) return NULL
    INTERN(s_alive, "alive"); INTERN(s_version, "version"); INTERN(s_prepared, "prepared"); INTERN(s_crec, "crec");
    INTERN(s_need, "need"); INTERN(s_stream, "stream"); INTERN(s_launch_args, "launch_args");
    INTERN(s_recorders, "_recorders"); INTERN(s_checked, "CHECKED"); INTERN(s_torch, "TORCH_TENSOR");
    INTERN(s_is_cuda, "is_cuda"); INTERN(s_nbytes, "nbytes"); INTERN(s_is_contiguous, "is_contiguous");
    INTERN(s_data_ptr, "data_ptr"); INTERN(s_cupy, "CUPY_ARRAY"); INTERN(s_data, "data"); INTERN(s_ptr, "ptr");
    INTERN(s_flags, "flags"); INTERN(s_c_contiguous, "c_contiguous");
#undef INTERN
    Py_RETURN_NONE;
}

/* act_stats() -> (slot hits since setup, occupied slots); act_forget(): empty the slots (tests) */
static PyObject *fc_act_stats(PyObject *self, PyObject *unused) {
    int n = 0;
    for (int i = 0; i < ACT_SLOTS; i++) n += act_slots[i].h != NULL;
    return Py_BuildValue("(Ki)", (unsigned long long)act_hits, n);
}

static PyObject *fc_act_forget(PyObject *self, PyObject *unused) {
    act_clear_slots();
    Py_RETURN_NONE;
}

/* torch.Tensor's own attributes, looked up once on the type (buffers.TORCH_TENSOR): is_cuda and nbytes are
   getset descriptors of torch._C.TensorBase (their getter called directly), is_contiguous and data_ptr method
   descriptors (called with the tensor as their only argument). What a generic attribute read does besides -
   the type's method cache, and for a method the instance __dict__ - is skipped: 8 reads a call with two
   tensors. Anything of another kind (a torch that defines one in Python) keeps the generic reads. */
static PyObject *tt_cached, *tt_is_cuda, *tt_nbytes, *tt_is_contig, *tt_data_ptr;

static void act_torch_attrs(PyObject *tt) {
    if (tt == tt_cached) return;
    PyObject *found[4] = {NULL, NULL, NULL, NULL}, *names[4] = {s_is_cuda, s_nbytes, s_is_contiguous, s_data_ptr};
    int ok = PyType_Check(tt);
    for (int i = 0; ok && i < 4; i++) {
        found[i] = _PyType_Lookup((PyTypeObject *)tt, names[i]); /* borrowed */
        ok = found[i] && (i < 2 ? Py_IS_TYPE(found[i], &PyGetSetDescr_Type) : Py_IS_TYPE(found[i], &PyMethodDescr_Type));
    }
    PyObject **dst[4] = {&tt_is_cuda, &tt_nbytes, &tt_is_contig, &tt_data_ptr};
    for (int i = 0; i < 4; i++) {
        PyObject *v = ok ? found[i] : NULL;
        Py_XINCREF(v);
        Py_XSETREF(*dst[i], v);
    }
    Py_XINCREF(tt);
    Py_XSETREF(tt_cached, tt);
}

static PyObject *tt_get(PyObject *descr, PyObject *obj, PyObject *name) {
    if (!descr) return PyObject_GetAttr(obj, name);
    PyGetSetDef *gs = ((PyGetSetDescrObject *)descr)->d_getset;
    return gs->get ? gs->get(obj, gs->closure) : PyObject_GetAttr(obj, name);
}

static PyObject *tt_call(PyObject *descr, PyObject *obj, PyObject *name) {
    if (!descr) return PyObject_CallMethodNoArgs(obj, name);
    return PyObject_Vectorcall(descr, &obj, 1, NULL);
}

/* act_probe(type, obj) -> (is_cuda, nbytes, is_contiguous(), data_ptr(), direct): the four reads as act_buffer
   makes them for a tensor of that type, and whether they went through the cached descriptors (tests) */
static PyObject *fc_act_probe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !s_is_cuda) {
        PyErr_SetString(PyExc_TypeError, "act_probe takes (type, obj) after act_setup");
        return NULL;
    }
    act_torch_attrs(args[0]);
    PyObject *r[4] = {tt_get(tt_is_cuda, args[1], s_is_cuda), tt_get(tt_nbytes, args[1], s_nbytes),
                      tt_call(tt_is_contig, args[1], s_is_contiguous), tt_call(tt_data_ptr, args[1], s_data_ptr)};
    PyObject *out = NULL;
    if (r[0] && r[1] && r[2] && r[3])
        out = Py_BuildValue("(OOOOO)", r[0], r[1], r[2], r[3], tt_is_cuda ? Py_True : Py_False);
    for (int i = 0; i < 4; i++) Py_XDECREF(r[i]);
    return out;
}

/* a cupy.ndarray (buffers.CUPY_ARRAY), read as buffers._cupy_ptr reads it: data.ptr not NULL, nbytes at least
   the span and flags.c_contiguous (else the Python function: the exact span and the same errors) */
static int act_cupy(PyObject *obj, long long need, uint64_t *v) {
    PyObject *d = PyObject_GetAttr(obj, s_data), *o = d ? PyObject_GetAttr(d, s_ptr) : NULL;
    Py_XDECREF(d);
    unsigned long long x = o && PyLong_Check(o) ? PyLong_AsUnsignedLongLong(o) : 0;
    Py_XDECREF(o);
    if (PyErr_Occurred() || !x) return 0;
    o = PyObject_GetAttr(obj, s_nbytes);
    long long nb = o && PyLong_Check(o) ? PyLong_AsLongLong(o) : -1;
    Py_XDECREF(o);
    if (PyErr_Occurred() || nb < need) return 0;
    PyObject *f = PyObject_GetAttr(obj, s_flags);
    o = f ? PyObject_GetAttr(f, s_c_contiguous) : NULL;
    Py_XDECREF(f);
    int ok = o == Py_True;
    Py_XDECREF(o);
    if (!ok) return 0;
    *v = x;
    return 1;
}

/* 1 with the address in *v, 0 when the buffer is not one the entry decides (the Python function's turn) */
static int act_buffer(PyObject *obj, PyObject *tt, long long need, uint64_t *v) {
    if (PyLong_CheckExact(obj)) {
        unsigned long long x = PyLong_AsUnsignedLongLong(obj);
        if (x == (unsigned long long)-1 && PyErr_Occurred()) return 0;
        *v = x;
        return x != 0;
    }
    if (act_cupy_type && act_cupy_type != Py_None && (PyObject *)Py_TYPE(obj) == act_cupy_type)
        return act_cupy(obj, need, v);
    if (tt == NULL || tt == Py_None || (PyObject *)Py_TYPE(obj) != tt) return 0;
    act_torch_attrs(tt);
    PyObject *o = tt_get(tt_is_cuda, obj, s_is_cuda);
    int ok = o == Py_True;
    Py_XDECREF(o);
    if (!ok) return 0;
    o = tt_get(tt_nbytes, obj, s_nbytes);
    long long nb = o ? PyLong_AsLongLong(o) : -1;
    Py_XDECREF(o);
    if (nb < need) return 0;
    o = tt_call(tt_is_contig, obj, s_is_contiguous);
    ok = o == Py_True;
    Py_XDECREF(o);
    if (!ok) return 0;
    o = tt_call(tt_data_ptr, obj, s_data_ptr);
    unsigned long long x = o ? PyLong_AsUnsignedLongLong(o) : 0;
    Py_XDECREF(o);
    if (PyErr_Occurred()) return 0;
    *v = x;
    return x != 0;
}

/* the module-level checks of every call: launch_args not replaced, no recording, PYDNN_CHECKED off; *tt the
   verified torch.Tensor type (borrowed; NULL / None: none yet), act_cupy_type the verified cupy.ndarray type.
   1 when the call may go on. */
static int act_module_ok(PyObject **tt) {
    PyObject *t = PyDict_GetItemWithError(act_driver_dict, s_launch_args);
    if (t != act_launch_args) return 0;
    t = PyDict_GetItemWithError(act_driver_dict, s_recorders);
    if (!t || !PyLong_CheckExact(t) || PyLong_AsLong(t) != 0) return 0;
    t = PyDict_GetItemWithError(act_buffers_dict, s_checked);
    if (t != Py_False) return 0;
    *tt = PyDict_GetItemWithError(act_buffers_dict, s_torch);
    act_cupy_type = PyErr_Occurred() ? NULL : PyDict_GetItemWithError(act_buffers_dict, s_cupy);
    return !PyErr_Occurred();
}

/* 1: answered (launched); 0: declined, no exception set */
static int act_try(PyObject *const *args, Py_ssize_t nargs) {
    PyObject *h, *t = NULL, *key = NULL, *prep = NULL, *rec = NULL, *crec = NULL, *need = NULL, *tt = NULL;
    PyObject *vs[3] = {NULL, NULL, NULL};
    int done = 0;
    if (nargs != 8 || !act_handle_type || !act_driver_dict) goto out;
    if (!PyFloat_CheckExact(args[2]) || !PyFloat_CheckExact(args[5])) goto out;
    h = args[0];
    uint64_t xp = 0, yp = 0, ins[3] = {0, 0, 0};
    uint64_t gen = act_gen ? __atomic_load_n(act_gen, __ATOMIC_ACQUIRE) : 0;
    act_slot_t *sl = &act_slots[act_index(args[1], args[3], args[6])];
    if (act_gen && sl->h == h && sl->a == args[1] && sl->xd == args[3] && sl->yd == args[6] && sl->gen == gen) {
        PyObject *btt = NULL; /* borrowed */
        t = PyObject_GetAttr(h, s_alive); /* a handle's alive flag written directly (tests) is still seen */
        if (t != Py_True || !act_module_ok(&btt)) goto out;
        if (!act_buffer(args[4], btt, sl->need_x, &xp) || !act_buffer(args[7], btt, sl->need_y, &yp)) goto out;
        ins[0] = xp;
        act_hits++;
        done = map_core(sl->crec, sl->stream, yp, ins, 1, PyFloat_AS_DOUBLE(args[2]), act_alpha2,
                        PyFloat_AS_DOUBLE(args[5])) == 0;
        goto out;
    }
    if ((PyObject *)Py_TYPE(h) != act_handle_type) goto out;
    t = PyObject_GetAttr(h, s_alive);
    if (t != Py_True) goto out;
    Py_CLEAR(t);
    PyObject *descs[3] = {args[1], args[3], args[6]};
    for (int i = 0; i < 3; i++)
        if (!(vs[i] = PyObject_GetAttr(descs[i], s_version))) goto out;
    key = PyTuple_Pack(7, act_zero, args[1], vs[0], args[3], vs[1], args[6], vs[2]);
    if (!key || !(prep = PyObject_GetAttr(h, s_prepared)) || !PyDict_Check(prep)) goto out;
    rec = PyDict_GetItemWithError(prep, key);
    if (!rec) goto out;
    Py_INCREF(rec);
    uint64_t c = 0, stream = 0;
    if (!(crec = PyObject_GetAttr(rec, s_crec)) || !PyLong_CheckExact(crec) || u64(crec, &c) || !c) goto out;
    if (!act_module_ok(&tt)) { tt = NULL; goto out; }
    Py_XINCREF(tt);
    if (!(need = PyObject_GetAttr(rec, s_need)) || !PyTuple_CheckExact(need) || PyTuple_GET_SIZE(need) < 2) goto out;
    long long need_y = PyLong_AsLongLong(PyTuple_GET_ITEM(need, 0)), need_x = PyLong_AsLongLong(PyTuple_GET_ITEM(need, 1));
    if (PyErr_Occurred()) goto out;
    if (!act_buffer(args[4], tt, need_x, &xp) || !act_buffer(args[7], tt, need_y, &yp)) goto out;
    t = PyObject_GetAttr(h, s_stream);
    if (!t || !PyLong_CheckExact(t) || u64(t, &stream)) goto out;
    Py_CLEAR(t);
    ins[0] = xp;
    done = map_core(c, stream, yp, ins, 1, PyFloat_AS_DOUBLE(args[2]), act_alpha2, PyFloat_AS_DOUBLE(args[5])) == 0;
    if (done && act_gen) { /* remember the call site under the generation read before the lookups */
        PyObject *objs[5] = {h, args[1], args[3], args[6], rec};
        PyObject **dst[5] = {&sl->h, &sl->a, &sl->xd, &sl->yd, &sl->rec};
        for (int i = 0; i < 5; i++) {
            Py_INCREF(objs[i]);
            Py_XSETREF(*dst[i], objs[i]);
        }
        sl->gen = gen; sl->crec = c; sl->stream = stream; sl->need_x = need_x; sl->need_y = need_y;
    }
out:
    Py_XDECREF(t); Py_XDECREF(key); Py_XDECREF(prep); Py_XDECREF(rec); Py_XDECREF(crec); Py_XDECREF(need);
    Py_XDECREF(tt);
    for (int i = 0; i < 3; i++) Py_XDECREF(vs[i]);
    if (PyErr_Occurred()) PyErr_Clear();
    return done;
}

static PyObject *fc_act_fwd(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (act_try(args, nargs)) Py_RETURN_NONE;
    Py_RETURN_FALSE;
}

/* The element-wise family's other cached calls answered here as activation_forward's (pydnn/ops/_elementwise.py,
   tuning.callpath.C_ENTRY_MAP): activation_backward, add_tensor, scale_tensor, op_tensor, transform_tensor. A
   kind says where each call's handle, descriptors, float scalars and buffers are among its arguments and which
   of the record's spans (Prepared.need) each buffer must cover. Unlike act_try, a kind never looks a record up:
   its call-site slots are filled by the entry after the Python function answered a call from its cache and
   noted the record it launched (map_note), under the records' generation read before the Python function ran
   and unchanged after it (no Set / Destroy / set_stream / switch change in between: the record is the one the
   key names now). A call that finds its slot - the same handle and descriptor objects, the generation unchanged
   - checks what can differ between calls exactly as the Python function's cached path does (the handle alive,
   float scalars, launch_args not replaced, no recording, PYDNN_CHECKED off, each buffer a positive int, a CUDA
   torch tensor / cupy array covering its span) and launches with run_map's map_core; anything else declines to
   the Python function, which decides and reports errors as before. */
/* MK_SETS sets of MK_WAYS slots a kind: a direct-mapped table of 16 let two of a step's call sites share a slot
   and evict each other by their addresses, so the CNN demo's step had 2 to 7 of its 10 transforms answered here
   from one run to the next; four ways hold a set's sites unless five hash to it */
#define MK_SETS 16
#define MK_WAYS 4
#define MK_SLOTS (MK_SETS * MK_WAYS)
#define MK_KINDS 13
typedef struct {
    int nargs, ndesc, desc[5];    /* the handle is argument 0; desc: the other arguments the key names (held by
                                     identity: descriptors, and softmax's algo / mode ints) */
    int alpha, alpha2, beta;      /* argument positions of float scalars; -1: the constant below */
    double c_alpha2, c_beta;
    int out, out_need, nin, in[3], in_need[3];
    int transform;                /* transform_tensor: the key's copy flag must be what the call makes it */
    int core;                     /* 0: a map record (map_core); 1: a plan record (plan_core); 2: reduce's plan
                                     record (plan_core after mk_reduce_extra); 3 / 4: batch norm's / normalization's
                                     records; 5: a convolution's one-launch plan (cv_core) */
} map_kind_t;

/* A planned launch of softmax / pooling (their _Plan: launches[0] when the pointers pass the plan's alignment,
   else launches[-1]), as their _run patches and launches it: each pointer a multiple of the element size (else
   declined: the Python function names it), the pointer fields at ptr_off (the call's pointers, then 0s), alpha
   and beta as doubles, the flags word keeping flags_keep's bits and flag_beta when beta != 0. */
typedef struct {
    uint64_t func, argv, params, finish;  /* finish: a second launch with the same parameters (reduce's), or 0 */
    uint32_t grid[3], block[3], fgrid[3], fblock[3];
} pk_launch_t;
typedef struct {
    pk_launch_t l[2];
    uint32_t nl, align;           /* align 0: every pointer 16-byte aligned; 1: congruent with the second mod 16;
                                     2: the second (the input) 16-byte aligned (reduce's align_mask) */
    uint32_t isz, nfield;         /* isz 0: no element alignment asked */
    uint32_t ptr_off[4];
    uint32_t alpha_off, beta_off, flags_off, flags_keep, flag_beta, flags_or;
    uint64_t ws_need;             /* reduce: the workspace bytes the plan needs (0: none; its pointer is 0) */
    uint32_t ws_align, decline;   /* decline: the Python function's always (reduce with indices) */
} pk_rec_t;

static int plan_core(uint64_t rec, uint64_t stream, const uint64_t *ptrs, int n, double alpha, double beta) {
    const pk_rec_t *r = (const pk_rec_t *)(uintptr_t)rec;
    int ok = 1;
    for (int i = 0; i < n; i++) {
        if (r->isz && ptrs[i] % r->isz) return -1;
        if (r->align == 2) ok &= i != 1 || (ptrs[i] & 15) == 0;
        else ok &= r->align ? ((ptrs[i] - ptrs[1]) & 15) == 0 : (ptrs[i] & 15) == 0;
    }
    const pk_launch_t *L = &r->l[r->nl > 1 && !ok ? 1 : 0];
    unsigned char *p = (unsigned char *)(uintptr_t)L->params;
    for (uint32_t f = 0; f < r->nfield && f < 4; f++) {
        uint64_t v = (int)f < n ? ptrs[f] : 0;
        memcpy(p + r->ptr_off[f], &v, 8);
    }
    memcpy(p + r->alpha_off, &alpha, 8);
    memcpy(p + r->beta_off, &beta, 8);
    uint32_t fl;
    memcpy(&fl, p + r->flags_off, 4);
    fl = (fl & r->flags_keep) | (beta != 0.0 ? r->flag_beta : 0) | r->flags_or;
    memcpy(p + r->flags_off, &fl, 4);
    int err = cu_launch((void *)(uintptr_t)L->func, L->grid[0], L->grid[1], L->grid[2], L->block[0], L->block[1],
                        L->block[2], 0, (void *)(uintptr_t)stream, (void **)(uintptr_t)L->argv, NULL);
    if (err || !L->finish) return err;
    /* a failed second launch: declined, and the Python function launches both again and reports the error */
    return cu_launch((void *)(uintptr_t)L->finish, L->fgrid[0], L->fgrid[1], L->fgrid[2], L->fblock[0], L->fblock[1],
                     L->fblock[2], 0, (void *)(uintptr_t)stream, (void **)(uintptr_t)L->argv, NULL);
}

static const map_kind_t mk_kinds[MK_KINDS] = {
    /* 0 activation_backward(h, a, alpha, yD, y, dyD, dy, xD, x, beta, dxD, dx): dx <- (dy, y, x); alpha2 unused (1) */
    {12, 5, {1, 3, 5, 7, 10}, 2, -1, 9, 1.0, 0.0, 11, 0, 3, {6, 4, 8}, {1, 2, 3}, 0, 0},
    /* 1 add_tensor(h, alpha, aD, A, beta, cD, C): C <- A */
    {7, 2, {2, 5}, 1, -1, 4, 0.0, 0.0, 6, 0, 1, {3}, {1}, 0, 0},
    /* 2 scale_tensor(h, yD, y, alpha): y <- y, beta 0 */
    {4, 1, {1}, 3, -1, -1, 0.0, 0.0, 2, 0, 1, {2}, {0}, 0, 0},
    /* 3 op_tensor(h, opD, alpha1, aD, A, alpha2, bD, B, beta, cD, C): C <- (A, B), or A alone (SQRT, NOT: the
       slot's input count) */
    {11, 4, {1, 3, 6, 9}, 2, 5, 8, 0.0, 0.0, 10, 0, 2, {4, 7}, {1, 2}, 0, 0},
    /* 4 transform_tensor(h, alpha, xD, x, beta, yD, y): y <- x */
    {7, 2, {2, 5}, 1, -1, 4, 0.0, 0.0, 6, 0, 1, {3}, {1}, 1, 0},
    /* 5 softmax_forward(h, algo, mode, alpha, xD, x, beta, yD, y): y <- x (a plan) */
    {9, 4, {1, 2, 4, 7}, 3, -1, 6, 0.0, 0.0, 8, 0, 1, {5}, {1}, 0, 1},
    /* 6 pooling_forward(h, poolingD, alpha, xD, x, beta, yD, y): y <- x (a plan) */
    {8, 3, {1, 3, 6}, 2, -1, 5, 0.0, 0.0, 7, 0, 1, {4}, {1}, 0, 1},
    /* 7 reduce_tensor(h, reduceD, indices, indicesSize, workspace, workspaceSize, alpha, aD, A, beta, cD, C): C <- A
       (a plan; its workspace and sizes checked in mk_reduce_extra) */
    {12, 3, {1, 7, 10}, 6, -1, 9, 0.0, 0.0, 11, 0, 1, {8}, {1}, 0, 2},
    /* 8 batch_normalization_forward_inference(h, mode, alpha, beta, xD, x, yD, y, bnD, scale, bias, mean, var, eps):
       its buffers, epsilon and launch in bn_core (a bn_rec_t) */
    {14, 4, {1, 4, 6, 8}, 2, -1, 3, 0.0, 0.0, 7, 0, 0, {0}, {0}, 0, 3},
    /* 9 norm_forward_inference(h, normD, alpha, beta, xD, x, yD, y, scaleBiasD, scale, bias): its buffers and
       launches in nm_core (an nm_rec_t) */
    {11, 4, {1, 4, 6, 8}, 2, -1, 3, 0.0, 0.0, 7, 0, 0, {0}, {0}, 0, 4},
    /* 10-12 the convolutions (h, alpha, aD, a, bD, b, convD, algo, workSpace, workSpaceSizeInBytes, beta, outD, out),
       the algorithm int held by identity as softmax's; the inputs in the plan's order (run_plan's a, b): forward
       (x, w), backward data (dy, w), backward filter (dy, x); the record's spans in that order, then out's */
    {13, 5, {2, 4, 6, 7, 11}, 1, -1, 10, 0.0, 0.0, 12, 2, 2, {3, 5}, {0, 1}, 0, 5},
    {13, 5, {2, 4, 6, 7, 11}, 1, -1, 10, 0.0, 0.0, 12, 2, 2, {5, 3}, {0, 1}, 0, 5},
    {13, 5, {2, 4, 6, 7, 11}, 1, -1, 10, 0.0, 0.0, 12, 2, 2, {5, 3}, {0, 1}, 0, 5},
};

typedef struct {
    PyObject *obj[6], *rec;      /* the handle, the kind's descriptors (strong: no address reused while held) */
    uint64_t gen, crec, stream;
    long long need[4];
    int nin, copy, same;
} mk_slot_t;
static mk_slot_t mk_slots[MK_KINDS][MK_SLOTS];
static unsigned char mk_victim[MK_KINDS][MK_SETS]; /* the way a full set gives up next (round robin) */
static uint64_t mk_hits[MK_KINDS];
static int mk_on;                 /* map_setup done (tuning.callpath.C_ENTRY_MAP) */
/* what the Python function noted on its cached path (map_note), for the entry that called it */
static PyObject *mk_noted;
static int mk_noted_kind = -1, mk_noted_depth = -1, mk_noted_nin, mk_noted_copy, mk_noted_same, mk_depth;
/* the thread that noted: another thread's Python function may run (and note) while this one's runs - the GIL is
   released between bytecodes - and its record must not be taken for this call's arguments */
static PyThreadState *mk_noted_ts;

static unsigned mk_index(const map_kind_t *k, PyObject *const *args) {
    uintptr_t x = (uintptr_t)args[0] >> 4;
    for (int i = 0; i < k->ndesc; i++) x ^= (uintptr_t)args[k->desc[i]] >> (5 + 2 * i);
    return (unsigned)((x ^ (x >> 11) ^ (x >> 23)) % MK_SETS);
}

/* whether slot s is this call site's (the same handle and descriptor objects) */
static int mk_site(const map_kind_t *k, const mk_slot_t *s, PyObject *const *args) {
    if (s->obj[0] != args[0]) return 0;
    for (int i = 0; i < k->ndesc; i++)
        if (s->obj[1 + i] != args[k->desc[i]]) return 0;
    return 1;
}

/* the slot holding this call site in its set, or NULL */
static mk_slot_t *mk_find(int kind, PyObject *const *args) {
    const map_kind_t *k = &mk_kinds[kind];
    mk_slot_t *set = &mk_slots[kind][mk_index(k, args) * MK_WAYS];
    for (int w = 0; w < MK_WAYS; w++)
        if (set[w].rec && mk_site(k, &set[w], args)) return &set[w];
    return NULL;
}

/* the slot a fill takes: this call site's, else an empty way, else the set's next victim */
static mk_slot_t *mk_place(int kind, PyObject *const *args) {
    mk_slot_t *s = mk_find(kind, args);
    if (s) return s;
    unsigned si = mk_index(&mk_kinds[kind], args);
    mk_slot_t *set = &mk_slots[kind][si * MK_WAYS];
    for (int w = 0; w < MK_WAYS; w++)
        if (!set[w].rec) return &set[w];
    return &set[mk_victim[kind][si]++ % MK_WAYS];
}

static void mk_clear_slot(mk_slot_t *s) {
    for (int i = 0; i < 6; i++) Py_CLEAR(s->obj[i]);
    Py_CLEAR(s->rec);
}

static void mk_clear_all(void) {
    for (int k = 0; k < MK_KINDS; k++)
        for (int i = 0; i < MK_SLOTS; i++) mk_clear_slot(&mk_slots[k][i]);
}

static int mk_float(PyObject *const *args, int pos, double c, double *v) {
    if (pos < 0) { *v = c; return 1; }
    if (!PyFloat_CheckExact(args[pos])) return 0;
    *v = PyFloat_AS_DOUBLE(args[pos]);
    return 1;
}

/* batch_normalization_forward_inference's cached call as its Python function makes it (pydnn/ops/batchnorm.py): epsilon
   a float >= PYDNN_BN_MIN_EPSILON; x and y positive ints or tensors covering their spans, aligned to their elements,
   not overlapping (an overlap - in place included - is the Python function's: no_partial_alias); scale, bias, mean
   and var covering the parameters' bytes, aligned to the statistics' type; then the launch _pick would choose for
   x | y: a 16-byte aligned pair, else one aligned to the mid vector width, else the rest (tier 2), each tier one
   launch whose fields (chunk_rows, row_begin, row_end: offset, size, value) are written into the shared params with
   the 17 pointers, alpha, beta, eps and the flags. A tier whose kernel the Python path has not loaded yet: declined. */
typedef struct {
    uint64_t func;
    uint32_t grid[3], block[3], nfield, pad_;
    uint32_t off[8], size[8];
    uint64_t val[8];
} bn_launch_t;
typedef struct {
    bn_launch_t tier[3];
    uint64_t params, argv, xs, ys, pbytes;
    uint32_t isz, asz, vm_bytes, flags_off, flags_base, flag_beta, eps_off, alpha_off;
    double min_eps;
} bn_rec_t;

static int bn_core(const bn_rec_t *r, uint64_t stream, PyObject *const *args, PyObject *tt, double al, double be) {
    if (!PyFloat_CheckExact(args[13])) return -1;
    double eps = PyFloat_AS_DOUBLE(args[13]);
    if (!(eps >= r->min_eps)) return -1;
    uint64_t x, y, prm[4];
    if (!act_buffer(args[5], tt, (long long)r->xs, &x) || !act_buffer(args[7], tt, (long long)r->ys, &y)) return -1;
    if (x % r->isz || y % r->isz) return -1;
    if (y < x + r->xs && x < y + r->ys) return -1;
    for (int i = 0; i < 4; i++)
        if (!act_buffer(args[9 + i], tt, (long long)r->pbytes, &prm[i]) || prm[i] % r->asz) return -1;
    uint64_t orb = x | y;
    int t = (orb & 15) == 0 ? 0 : (r->vm_bytes && orb % r->vm_bytes == 0) ? 1 : 2;
    const bn_launch_t *L = &r->tier[t];
    if (!L->func) return -1;
    unsigned char *p = (unsigned char *)(uintptr_t)r->params;
    uint64_t ptrs[17] = {x, y, 0, 0, 0, 0, 0, prm[0], prm[1], prm[2], prm[3], 0, 0, 0, 0, 0, 0};
    memcpy(p, ptrs, sizeof ptrs);
    memcpy(p + r->alpha_off, &al, 8);
    memcpy(p + r->alpha_off + 8, &be, 8);
    memcpy(p + r->eps_off, &eps, 8);
    uint32_t fl = r->flags_base | (be != 0.0 ? r->flag_beta : 0);
    memcpy(p + r->flags_off, &fl, 4);
    for (uint32_t i = 0; i < L->nfield && i < 8; i++) memcpy(p + L->off[i], &L->val[i], L->size[i] <= 8 ? L->size[i] : 8);
    return cu_launch((void *)(uintptr_t)L->func, L->grid[0], L->grid[1], L->grid[2], L->block[0], L->block[1],
                     L->block[2], 0, (void *)(uintptr_t)stream, (void **)(uintptr_t)r->argv, NULL);
}

/* norm_forward_inference's cached call as its Python function makes it (pydnn/ops/normalization.py's _forward,
   _pointers_fwd, _run): x and y covering their spans and aligned to their elements, not overlapping (the Python
   function's: no_partial_alias), scale covering the parameters and 4-byte aligned, bias None / 0 or the same; the
   alternative by x | y's 16-byte alignment where the plan has two (vec_first); each of its launches gets the 10
   pointers (out, x, 0, scale, bias, 0...) and alpha, beta, 0, 0 at the start of its params, the flags without beta2
   / stats and with beta when beta != 0. An alternative whose kernels the Python path has not loaded: declined. */
typedef struct {
    uint64_t func, argv, params;
    uint32_t grid[3], block[3], smem, pad_;
} nm_launch_t;
typedef struct {
    nm_launch_t alt[2][4];
    uint32_t nl[2], nalt, vec_first;
    uint64_t xs, ys, sbs;
    uint32_t isz, flags_off, flags_clear, flag_beta;
} nm_rec_t;

static int nm_core(const nm_rec_t *r, uint64_t stream, PyObject *const *args, PyObject *tt, double al, double be) {
    uint64_t x, y, sc, bi = 0;
    if (!act_buffer(args[5], tt, (long long)r->xs, &x) || !act_buffer(args[7], tt, (long long)r->ys, &y)) return -1;
    if (x % r->isz || y % r->isz) return -1;
    if (y < x + r->xs && x < y + r->ys) return -1;
    if (!act_buffer(args[9], tt, (long long)r->sbs, &sc) || sc % 4) return -1;
    PyObject *b = args[10];
    if (!(b == Py_None || (PyLong_CheckExact(b) && PyLong_AsLongLong(b) == 0))) {
        if (PyErr_Occurred() || !act_buffer(b, tt, (long long)r->sbs, &bi) || bi % 4) return -1;
    }
    int a = (r->nalt > 1 && r->vec_first && ((x | y) % 16)) ? 1 : 0;
    if (!r->nl[a]) return -1;
    for (uint32_t i = 0; i < r->nl[a]; i++)
        if (!r->alt[a][i].func) return -1;
    uint64_t ptrs[10] = {y, x, 0, sc, bi, 0, 0, 0, 0, 0};
    double sc4[4] = {al, be, 0.0, 0.0};
    for (uint32_t i = 0; i < r->nl[a]; i++) {
        const nm_launch_t *L = &r->alt[a][i];
        unsigned char *p = (unsigned char *)(uintptr_t)L->params;
        memcpy(p, ptrs, sizeof ptrs);
        memcpy(p + sizeof ptrs, sc4, sizeof sc4);
        uint32_t fl;
        memcpy(&fl, p + r->flags_off, 4);
        fl = (fl & ~r->flags_clear) | (be != 0.0 ? r->flag_beta : 0);
        memcpy(p + r->flags_off, &fl, 4);
        int err = cu_launch((void *)(uintptr_t)L->func, L->grid[0], L->grid[1], L->grid[2], L->block[0], L->block[1],
                            L->block[2], L->smem, (void *)(uintptr_t)stream, (void **)(uintptr_t)L->argv, NULL);
        if (err) return err; /* (a later launch failed: the Python function launches them all again and reports) */
    }
    return 0;
}

/* reduce_tensor's arguments besides its tensors, as its _buffers checks them: both sizes plain ints >= 0, no
   indices wanted (else the Python function's), the workspace (when the plan has one) at least its bytes by size
   and by buffer and WS_ALIGN-aligned; 1 with its address in *ws */
/* a workspace as a cached call checks it: its size a plain int >= need; none needed: 0 whatever the buffer; else a
   buffer of need bytes whose address is a multiple of align (when set) */
static int mk_workspace(PyObject *buf, PyObject *size, PyObject *tt, uint64_t need, uint64_t align, uint64_t *ws) {
    if (!PyLong_CheckExact(size)) return 0;
    long long n = PyLong_AsLongLong(size);
    if (n < 0 || (unsigned long long)n < need) return 0; /* (an overflow: -1 and an exception, cleared by the caller) */
    *ws = 0;
    if (!need) return 1;
    if (!act_buffer(buf, tt, (long long)need, ws)) return 0;
    return align ? *ws % align == 0 : 1;
}

static int mk_reduce_extra(PyObject *const *args, PyObject *tt, const pk_rec_t *r, uint64_t *ws) {
    if (r->decline || !PyLong_CheckExact(args[3]) || PyLong_AsLongLong(args[3]) < 0) return 0; /* (indices' size) */
    return mk_workspace(args[4], args[5], tt, r->ws_need, r->ws_align, ws);
}

/* A convolution's plans.Plan (one implicit-GEMM launch, and the split-K fold's when it has one) as run_plan
   patches and launches it: the ConvParams' x / w (the plan's a / b), z and bias 0 (a plain convolution), out (the
   workspace under a fold), alpha / beta doubles and the flags word (FLAG_BETA when beta != 0, FLAG_PAIR when the
   plan may and out is 4-byte aligned); the fold's ConvAuxParams out / in / alpha / beta / flags. Pointers that are
   not multiples of the element size, or of the plan's vector alignment (a and b), decline: the Python function
   names them. A plan whose fold is a ConvParams (a split fwd_wgmma) or that is a StepPlan has no record. */
typedef struct {
    uint64_t func, argv, params, ffunc, fargv, fparams;
    uint32_t grid[3], block[3], smem, fgrid[3], fblock[3];
    uint32_t isz, align, pair_ok, flag_beta, flag_pair;
    uint32_t x_off, w_off, out_off, z_off, bias_off, alpha_off, beta_off, flags_off;
    uint32_t f_out_off, f_in_off, f_alpha_off, f_beta_off, f_flags_off;
    uint64_t ws_need, ws_align;
} cv_rec_t;

static void cv_put(unsigned char *p, uint32_t off, const void *v, size_t n) { memcpy(p + off, v, n); }

static int cv_core(const cv_rec_t *r, uint64_t stream, uint64_t a, uint64_t b, uint64_t o, uint64_t ws, double al,
                   double be) {
    if (r->isz && (a % r->isz || b % r->isz || o % r->isz)) return -1;
    if (r->align && (a % r->align || b % r->align)) return -1;
    unsigned char *p = (unsigned char *)(uintptr_t)r->params;
    uint64_t zero = 0, out = r->ffunc ? ws : o;
    cv_put(p, r->x_off, &a, 8); cv_put(p, r->w_off, &b, 8);
    cv_put(p, r->z_off, &zero, 8); cv_put(p, r->bias_off, &zero, 8);
    cv_put(p, r->alpha_off, &al, 8); cv_put(p, r->beta_off, &be, 8);
    uint32_t fl;
    memcpy(&fl, p + r->flags_off, 4);
    fl = (fl & ~(r->flag_beta | r->flag_pair)) | (be != 0.0 ? r->flag_beta : 0) |
         (r->pair_ok && o % 4 == 0 ? r->flag_pair : 0);
    cv_put(p, r->flags_off, &fl, 4);
    cv_put(p, r->out_off, &out, 8);
    int err = cu_launch((void *)(uintptr_t)r->func, r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1],
                        r->block[2], r->smem, (void *)(uintptr_t)stream, (void **)(uintptr_t)r->argv, NULL);
    if (err || !r->ffunc) return err;
    unsigned char *f = (unsigned char *)(uintptr_t)r->fparams;
    cv_put(f, r->f_out_off, &o, 8); cv_put(f, r->f_in_off, &ws, 8);
    cv_put(f, r->f_alpha_off, &al, 8); cv_put(f, r->f_beta_off, &be, 8);
    memcpy(&fl, f + r->f_flags_off, 4);
    fl = (fl & ~r->flag_beta) | (be != 0.0 ? r->flag_beta : 0);
    cv_put(f, r->f_flags_off, &fl, 4);
    /* a failed fold: declined, and the Python function runs both launches again and reports the error */
    return cu_launch((void *)(uintptr_t)r->ffunc, r->fgrid[0], r->fgrid[1], r->fgrid[2], r->fblock[0], r->fblock[1],
                     r->fblock[2], 0, (void *)(uintptr_t)stream, (void **)(uintptr_t)r->fargv, NULL);
}

/* 1: answered (launched); 0: declined, no exception set */
static int mk_try(int kind, PyObject *const *args, Py_ssize_t nargs) {
    const map_kind_t *k = &mk_kinds[kind];
    if (!mk_on || !act_gen || nargs != k->nargs || !act_driver_dict) return 0;
    uint64_t gen = __atomic_load_n(act_gen, __ATOMIC_ACQUIRE);
    mk_slot_t *s = mk_find(kind, args);
    if (!s || s->gen != gen) return 0;
    double al, a2, be;
    if (!mk_float(args, k->alpha, 0.0, &al) || !mk_float(args, k->alpha2, k->c_alpha2, &a2) ||
        !mk_float(args, k->beta, k->c_beta, &be))
        return 0;
    if (k->transform && (s->same && al == 1.0 && be == 0.0) != s->copy) return 0;
    int done = 0;
    PyObject *t = PyObject_GetAttr(args[0], s_alive), *tt = NULL; /* tt borrowed */
    uint64_t o = 0, ins[3] = {0, 0, 0};
    if (t != Py_True || !act_module_ok(&tt)) goto out;
    if (k->core == 3 || k->core == 4) {
        done = (k->core == 3 ? bn_core((const bn_rec_t *)(uintptr_t)s->crec, s->stream, args, tt, al, be)
                             : nm_core((const nm_rec_t *)(uintptr_t)s->crec, s->stream, args, tt, al, be)) == 0;
        mk_hits[kind] += done;
        goto out;
    }
    if (!act_buffer(args[k->out], tt, s->need[k->out_need], &o)) goto out;
    for (int j = 0; j < s->nin; j++)
        if (!act_buffer(args[k->in[j]], tt, s->need[k->in_need[j]], &ins[j])) goto out;
    if (k->core == 1) {
        uint64_t ptrs[4] = {o, ins[0], ins[1], ins[2]};
        done = plan_core(s->crec, s->stream, ptrs, 1 + s->nin, al, be) == 0;
    } else if (k->core == 5) {
        const cv_rec_t *r = (const cv_rec_t *)(uintptr_t)s->crec;
        uint64_t ws = 0;
        /* (the workspace: the plan's bytes, at a multiple of its acc_size) */
        if (s->nin == 2 && mk_workspace(args[8], args[9], tt, r->ws_need, r->ws_align, &ws))
            done = cv_core(r, s->stream, ins[0], ins[1], o, ws, al, be) == 0;
    } else if (k->core == 2) {
        uint64_t ptrs[4] = {o, ins[0], 0, 0}; /* out, in_, indices (none), workspace */
        if (mk_reduce_extra(args, tt, (const pk_rec_t *)(uintptr_t)s->crec, &ptrs[3]))
            done = plan_core(s->crec, s->stream, ptrs, 4, al, be) == 0;
    } else {
        done = map_core(s->crec, s->stream, o, ins, s->nin, al, a2, be) == 0;
    }
    mk_hits[kind] += done;
out:
    Py_XDECREF(t);
    if (PyErr_Occurred()) PyErr_Clear();
    return done;
}

/* after the Python function answered args (gen0: the generation before it ran): the slot of this call site
   takes the record it noted. Never raises. */
static void mk_fill(int kind, PyObject *const *args, Py_ssize_t nargs, uint64_t gen0) {
    const map_kind_t *k = &mk_kinds[kind];
    PyObject *rec = mk_noted, *crec = NULL, *need = NULL, *st = NULL;
    mk_noted = NULL;
    if (!rec) return;
    if (mk_noted_kind != kind || mk_noted_depth != mk_depth || mk_noted_ts != PyThreadState_Get() ||
        nargs != k->nargs || !act_gen ||
        __atomic_load_n(act_gen, __ATOMIC_ACQUIRE) != gen0 || mk_noted_nin < 0 || mk_noted_nin > k->nin)
        goto out;
    mk_slot_t *s = mk_place(kind, args);
    uint64_t c = 0, stream = 0;
    if (!(crec = PyObject_GetAttr(rec, s_crec)) || !PyLong_CheckExact(crec) || u64(crec, &c) || !c) goto out;
    if (s->rec == rec && s->crec == c && s->gen == gen0 && s->obj[0] == args[0]) { /* already this site's */
        int same = 1;
        for (int i = 0; i < k->ndesc; i++) same &= s->obj[1 + i] == args[k->desc[i]];
        if (same && s->nin == mk_noted_nin && s->copy == mk_noted_copy && s->same == mk_noted_same) goto out;
    }
    long long nd[4] = {0, 0, 0, 0};
    Py_ssize_t nn = 0;
    if (k->core < 3 || k->core == 5) { /* (batch norm's and normalization's records hold their own spans) */
        if (!(need = PyObject_GetAttr(rec, s_need)) || !PyTuple_CheckExact(need)) goto out;
        nn = PyTuple_GET_SIZE(need);
    }
    if (nn > 4) goto out;
    for (Py_ssize_t i = 0; i < nn; i++) {
        nd[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(need, i));
        if (PyErr_Occurred()) goto out;
    }
    if ((k->core < 3 || k->core == 5) && k->out_need >= nn) goto out;
    for (int j = 0; j < mk_noted_nin; j++)
        if (k->in_need[j] >= nn) goto out;
    if (!(st = PyObject_GetAttr(args[0], s_stream)) || !PyLong_CheckExact(st) || u64(st, &stream)) goto out;
    mk_clear_slot(s);
    Py_INCREF(args[0]);
    s->obj[0] = args[0];
    for (int i = 0; i < k->ndesc; i++) {
        Py_INCREF(args[k->desc[i]]);
        s->obj[1 + i] = args[k->desc[i]];
    }
    Py_INCREF(rec);
    s->rec = rec;
    s->gen = gen0; s->crec = c; s->stream = stream;
    memcpy(s->need, nd, sizeof nd);
    s->nin = mk_noted_nin; s->copy = mk_noted_copy; s->same = mk_noted_same;
out:
    Py_XDECREF(rec); Py_XDECREF(crec); Py_XDECREF(need); Py_XDECREF(st);
    mk_noted_kind = -1;
    if (PyErr_Occurred()) PyErr_Clear();
}

/* map_note(kind, record, inputs, copy, same): the Python function's cached path launched `record` with that many
   inputs (transform_tensor: its key's copy flag and whether x and y share a data type) */
static PyObject *fc_map_note(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "map_note takes 5 arguments");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]), nin = PyLong_AsLong(args[2]);
    int copy = PyObject_IsTrue(args[3]), same = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_INCREF(args[1]);
    Py_XSETREF(mk_noted, args[1]);
    mk_noted_kind = (int)kind; mk_noted_depth = mk_depth; mk_noted_nin = (int)nin;
    mk_noted_ts = PyThreadState_Get();
    mk_noted_copy = copy; mk_noted_same = same;
    Py_RETURN_NONE;
}

/* map_setup(): the kinds answer from now on (act_setup first: the module objects they read); map_stats() ->
   (hits per kind, occupied slots per kind); map_forget(): empty the slots (tests) */
static PyObject *fc_map_setup(PyObject *self, PyObject *unused) {
    if (!act_driver_dict || !act_gen) Py_RETURN_FALSE;
    mk_clear_all();
    mk_on = 1;
    Py_RETURN_TRUE;
}

static PyObject *fc_map_stats(PyObject *self, PyObject *unused) {
    PyObject *hits = PyTuple_New(MK_KINDS), *occ = PyTuple_New(MK_KINDS);
    if (!hits || !occ) { Py_XDECREF(hits); Py_XDECREF(occ); return NULL; }
    for (int k = 0; k < MK_KINDS; k++) {
        int n = 0;
        for (int i = 0; i < MK_SLOTS; i++) n += mk_slots[k][i].rec != NULL;
        PyTuple_SET_ITEM(hits, k, PyLong_FromUnsignedLongLong(mk_hits[k]));
        PyTuple_SET_ITEM(occ, k, PyLong_FromLong(n));
    }
    return Py_BuildValue("(NN)", hits, occ);
}

static PyObject *fc_map_forget(PyObject *self, PyObject *unused) {
    mk_clear_all();
    Py_RETURN_NONE;
}

/* The public activation_forward itself as a callable object (act_entry(fallback)): act_try, and for anything
   it declines (keywords included) the fallback - the Python function - with the same arguments. No Python
   frame of its own: the Python entry it replaces (a def calling act_fwd) cost ~0.2-0.3 us a call here. Has a
   __dict__, so functools.update_wrapper gives it the function's name, doc, __wrapped__ (signature). */
typedef struct {
    PyObject_HEAD
    PyObject *fallback, *dict;
    vectorcallfunc vectorcall;
    int kind; /* -1: activation_forward (act_try); else a map kind (mk_try) */
} entry_t;

static PyObject *entry_vcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    entry_t *e = (entry_t *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (e->kind < 0) {
        if (!kwnames && act_try(args, n)) Py_RETURN_NONE;
        return PyObject_Vectorcall(e->fallback, args, nargsf, kwnames);
    }
    if (!kwnames && mk_try(e->kind, args, n)) Py_RETURN_NONE;
    if (kwnames || !mk_on || !act_gen) return PyObject_Vectorcall(e->fallback, args, nargsf, kwnames);
    /* the Python function answers; if it noted the record of its cached path (at this depth: not a nested
       entry's) and no generation move happened meanwhile, this call site's slot takes it */
    uint64_t gen0 = __atomic_load_n(act_gen, __ATOMIC_ACQUIRE);
    Py_CLEAR(mk_noted);
    mk_noted_kind = -1;
    mk_depth++;
    PyObject *r = PyObject_Vectorcall(e->fallback, args, nargsf, NULL);
    mk_depth--;
    if (r) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        mk_depth++; /* the note was made inside the call, one level down */
        mk_fill(e->kind, args, n, gen0);
        mk_depth--;
        PyErr_Restore(et, ev, tb);
    } else {
        Py_CLEAR(mk_noted);
        mk_noted_kind = -1;
    }
    return r;
}

static void entry_dealloc(PyObject *self) {
    entry_t *e = (entry_t *)self;
    Py_XDECREF(e->fallback);
    Py_XDECREF(e->dict);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *entry_repr(PyObject *self) {
    return PyUnicode_FromFormat("<compiled entry of %R>", ((entry_t *)self)->fallback);
}

static PyGetSetDef entry_getset[] = {{"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
                                     {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject entry_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pydnn_fastcall.Entry",
    .tp_basicsize = sizeof(entry_t),
    .tp_dealloc = entry_dealloc,
    .tp_vectorcall_offset = offsetof(entry_t, vectorcall),
    .tp_repr = entry_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_getset = entry_getset,
    .tp_dictoffset = offsetof(entry_t, dict),
};

static PyObject *fc_act_entry(PyObject *self, PyObject *fallback) {
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "act_entry takes a callable");
        return NULL;
    }
    if (entry_type.tp_flags & Py_TPFLAGS_READY ? 0 : PyType_Ready(&entry_type) < 0) return NULL;
    entry_t *e = PyObject_New(entry_t, &entry_type);
    if (!e) return NULL;
    Py_INCREF(fallback);
    e->fallback = fallback;
    e->dict = NULL;
    e->vectorcall = entry_vcall;
    e->kind = -1;
    return (PyObject *)e;
}

/* map_entry(kind, fallback): a map kind's public function as a compiled callable over its Python function */
static PyObject *fc_map_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long kind = nargs == 2 ? PyLong_AsLong(args[0]) : -2;
    if (PyErr_Occurred()) return NULL;
    if (kind < 0 || kind >= MK_KINDS) {
        PyErr_SetString(PyExc_ValueError, "map_entry takes (kind, callable) with a known kind");
        return NULL;
    }
    PyObject *e = fc_act_entry(self, args[1]);
    if (e) ((entry_t *)e)->kind = (int)kind;
    return e;
}

static PyMethodDef methods[] = {
    {"act_setup", (PyCFunction)(void (*)(void))fc_act_setup, METH_FASTCALL, "the activation entry's objects"},
    {"act_fwd", (PyCFunction)(void (*)(void))fc_act_fwd, METH_FASTCALL, "activation_forward's cached call"},
    {"act_stats", fc_act_stats, METH_NOARGS, "(call-site slot hits, occupied slots)"},
    {"act_probe", (PyCFunction)(void (*)(void))fc_act_probe, METH_FASTCALL, "act_buffer's tensor reads (tests)"},
    {"act_entry", fc_act_entry, METH_O, "activation_forward as a compiled callable over its Python function"},
    {"act_forget", fc_act_forget, METH_NOARGS, "empty the call-site slots"},
    {"map_note", (PyCFunction)(void (*)(void))fc_map_note, METH_FASTCALL, "the record a cached call launched"},
    {"map_setup", fc_map_setup, METH_NOARGS, "the map kinds answer from now on"},
    {"map_stats", fc_map_stats, METH_NOARGS, "(hits per map kind, occupied slots per kind)"},
    {"map_forget", fc_map_forget, METH_NOARGS, "empty the map kinds' slots"},
    {"map_entry", (PyCFunction)(void (*)(void))fc_map_entry, METH_FASTCALL, "a map kind's compiled entry"},
    {"patch_launch", (PyCFunction)(void (*)(void))fc_patch_launch, METH_FASTCALL, "a patched generated-kernel launch"},
    {"launch", (PyCFunction)(void (*)(void))fc_launch, METH_FASTCALL, "cuLaunchKernel with int arguments"},
    {"init", fc_init, METH_NOARGS, "dlsym cuLaunchKernel; whether it was found"},
    {"map_launch", (PyCFunction)(void (*)(void))fc_map_launch, METH_FASTCALL, "run_map's patch and launch"},
    {"launch_items", (PyCFunction)(void (*)(void))fc_launch_items, METH_FASTCALL, "a plan's launches"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "@NAME@", NULL, -1, methods};

PyMODINIT_FUNC PyInit_@NAME@(void) { return PyModule_Create(&module); }
"""


class MapRec(ctypes.Structure):
    _fields_ = [("params", ctypes.c_uint64), ("argv", ctypes.c_uint64), ("vec_func", ctypes.c_uint64),
                ("scalar_func", ctypes.c_uint64), ("vec_grid", ctypes.c_uint32 * 3),
                ("vec_block", ctypes.c_uint32 * 3), ("scalar_grid", ctypes.c_uint32 * 3),
                ("scalar_block", ctypes.c_uint32 * 3), ("in_masks", ctypes.c_uint64), ("out_mask", ctypes.c_uint64),
                ("base_flags", ctypes.c_uint32), ("flag_beta", ctypes.c_uint32), ("flags_off", ctypes.c_uint32),
                ("map_inputs", ctypes.c_uint32)]


class Item(ctypes.Structure):
    """pydnn_item_t: one launch (kind 0) or device-to-device copy (kind 1) of a replayed plan."""
    _fields_ = [("kind", ctypes.c_uint64), ("func", ctypes.c_uint64), ("argv", ctypes.c_uint64),
                ("smem", ctypes.c_uint64), ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3),
                ("dst", ctypes.c_uint64), ("src", ctypes.c_uint64), ("nbytes", ctypes.c_uint64)]


_lock = threading.Lock()
_state = {}  # "lib": the loaded module's lib, or None once loading failed


def _module_path():
    tag = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    return cache_dir() / "lib" / sys.implementation.cache_tag / f"_pydnn_fastcall_{tag}"


def _build(path, name):
    """Compile the extension with the C compiler Python was built with (or cc / gcc): no cffi needed."""
    import shutil
    import subprocess
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "").split()[:1]
    cc = cc[0] if cc and shutil.which(cc[0]) else (shutil.which("cc") or shutil.which("gcc"))
    if cc is None:
        raise RuntimeError("no C compiler")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, src = tempfile.mkstemp(dir=path.parent, prefix=".fastcall-", suffix=".c")
    with os.fdopen(fd, "w") as f:
        f.write(SOURCE.replace("@NAME@", name))
    out = str(path) + ".tmp" + str(os.getpid())
    try:
        subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", src, "-o", out,
                        "-ldl"], check=True, capture_output=True, timeout=300)
        os.replace(out, path)
    finally:
        for f in (src, out):
            if os.path.exists(f):
                os.unlink(f)


def _load():
    import logging
    import sysconfig

    base = _module_path()
    name = base.name
    path = base.with_name(name + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    if not path.is_file():
        logging.getLogger("pydnn").info("pydnn: compiling the launch helper %s", path.name)
        _build(path, name)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod if mod.init() else None


def launcher():
    """The helper's map_launch, or None when it cannot be had here (no C compiler, no libcuda)."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                try:
                    lib = _load()
                except Exception:  # noqa: BLE001 - any failure: the Python launch path
                    lib = None
                _state["lib"] = lib
    lib = _state["lib"]
    return None if lib is None else lib.map_launch


def install():
    """Route driver.launch_args through the helper's launch (tuning.callpath.C_LAUNCH; a handle's creation
    calls this). Returns whether it is installed."""
    from .. import tuning

    if not tuning.callpath.C_LAUNCH or launcher() is None:
        driver.set_fast_launch(None)
        return False
    driver.set_fast_launch(_state["lib"].launch)
    return True


def items_launcher():
    """The module's launch_items (a replayed plan's launches in one call), or None."""
    launcher()
    lib = _state["lib"]
    return None if lib is None else lib.launch_items


def record(pr):
    """The C record of a Prepared launch (kept alive by the Prepared), or None when its kernels are not
    driver functions (a CPU handle's placeholders)."""
    from .params import FLAG_BETA, MAP_INPUTS, MapParams

    try:
        vf, sf = int(pr.vec_func), int(pr.scalar_func)
    except (TypeError, ValueError):
        return None
    r = MapRec()
    r.params, r.argv = ctypes.addressof(pr.params), pr.argv[1]
    r.vec_func, r.scalar_func = vf, sf
    r.vec_grid[:], r.vec_block[:] = list(pr.vec_grid), list(pr.vec_block)
    r.scalar_grid[:], r.scalar_block[:] = list(pr.scalar_grid), list(pr.block)
    r.in_masks, r.out_mask = pr.in_masks, pr.out_mask
    r.base_flags, r.flag_beta, r.flags_off, r.map_inputs = pr.base_flags, FLAG_BETA, MapParams.flags.offset, MAP_INPUTS
    return r


class PatchRec(ctypes.Structure):
    """pydnn_patch_rec_t: a launch whose parameter struct takes pointers at fixed offsets (patch_launch)."""
    _fields_ = [("func", ctypes.c_uint64), ("argv", ctypes.c_uint64), ("params", ctypes.c_uint64),
                ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint32),
                ("nptr", ctypes.c_uint32), ("flags_off", ctypes.c_uint32), ("vec", ctypes.c_uint32),
                ("vec_mask", ctypes.c_uint64), ("vec_sel", ctypes.c_uint64), ("ptr_off", ctypes.c_uint32 * 16)]


def patch_launcher():
    """The module's patch_launch, or None (no helper here, or tuning.callpath.C_LAUNCH off)."""
    from .. import tuning

    if not tuning.callpath.C_LAUNCH:
        return None
    launcher()
    lib = _state["lib"]
    return None if lib is None else lib.patch_launch


def patch_record(func, grid, block, smem, params, argv_addr, ptr_offsets, vec_mask=0, vec_sel=0, flags_off=None):
    """A PatchRec for patch_launch (kept alive by the caller, with `params`), or None when `func` is not a
    driver function (a CPU handle's placeholder) or there are more than 16 pointers."""
    try:
        f = int(func)
    except (TypeError, ValueError):
        return None
    if len(ptr_offsets) > 16:
        return None
    r = PatchRec()
    r.func, r.argv, r.params = f, argv_addr, ctypes.addressof(params)
    r.grid[:], r.block[:] = list(grid), list(block)
    r.smem, r.nptr = smem, len(ptr_offsets)
    r.ptr_off[:len(ptr_offsets)] = list(ptr_offsets)
    r.vec = 1 if flags_off is not None else 0
    r.flags_off = flags_off or 0
    r.vec_mask, r.vec_sel = vec_mask, vec_sel
    return r


def activation_entry(handle_type, driver_module, launch_args, buffers_module, alpha2):
    """The module's act_fwd set up with pydnn's objects (activation_forward's cached call in C), or None."""
    launcher()
    lib = _state["lib"]
    if lib is None or not hasattr(lib, "act_fwd"):
        return None
    from .. import tuning

    gen = tuning.records_gen_address() if tuning.callpath.C_ENTRY_SITES else 0
    lib.act_setup(handle_type, driver_module, launch_args, buffers_module, alpha2, gen)
    return lib.act_fwd


def activation_public(fallback):
    """activation_forward as one compiled callable: the entry's answer, else fallback(*args, **kwargs); None
    where the helper has no such object (call activation_entry first)."""
    lib = _state.get("lib")
    if lib is None or not hasattr(lib, "act_entry"):
        return None
    import functools

    return functools.update_wrapper(lib.act_entry(fallback), fallback)


# The map kinds of the compiled entry (fastcall's mk_kinds, same order): the element-wise family's cached calls
# besides activation_forward, answered in C from call-site slots the Python function's cached path fills (map_note)
MAP_KINDS = {"activation_backward": 0, "add_tensor": 1, "scale_tensor": 2, "op_tensor": 3, "transform_tensor": 4,
             "softmax_forward": 5, "pooling_forward": 6, "reduce_tensor": 7, "batch_normalization_forward_inference": 8,
             "norm_forward_inference": 9, "convolution_forward": 10, "convolution_backward_data": 11,
             "convolution_backward_filter": 12}


class PkLaunch(ctypes.Structure):
    _fields_ = [("func", ctypes.c_uint64), ("argv", ctypes.c_uint64), ("params", ctypes.c_uint64),
                ("finish", ctypes.c_uint64), ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3),
                ("fgrid", ctypes.c_uint32 * 3), ("fblock", ctypes.c_uint32 * 3)]


class PkRec(ctypes.Structure):
    """pk_rec_t: a softmax / pooling / reduce plan's first and last launches, as their _run patches them
    (plan_core)."""
    _fields_ = [("l", PkLaunch * 2), ("nl", ctypes.c_uint32), ("align", ctypes.c_uint32), ("isz", ctypes.c_uint32),
                ("nfield", ctypes.c_uint32), ("ptr_off", ctypes.c_uint32 * 4), ("alpha_off", ctypes.c_uint32),
                ("beta_off", ctypes.c_uint32), ("flags_off", ctypes.c_uint32), ("flags_keep", ctypes.c_uint32),
                ("flag_beta", ctypes.c_uint32), ("flags_or", ctypes.c_uint32), ("ws_need", ctypes.c_uint64),
                ("ws_align", ctypes.c_uint32), ("decline", ctypes.c_uint32)]


def plan_record(pl, ptr_fields, params_type, flags_keep, flag_beta, congruent=False, isz=None, align=None,
                finish=None, flags_or=0, ws_need=0, ws_align=0, decline=False):
    """Set pl.crec (the address of a PkRec kept in pl.crec_obj; 0 where a kernel is not a driver function: a CPU
    handle's placeholders) for a plan whose launches' params are params_type structs with alpha / beta doubles
    and a flags word, the call's pointers written to its fields named ptr_fields (in the call's order); launches[0]
    serves pointers that pass the alignment (all 16-byte aligned, or congruent
    with the second; align=2: the second alone), launches[-1] the others. isz: the element size every pointer
    must be a multiple of (pl.itemsize unless given; 0: none). finish(launch) -> (func, grid, block) of a second
    launch with the same parameters when that launch has one, else None (reduce's segmented rows). flags_or: bits
    the call sets in the flags word; ws_need / ws_align / decline: reduce's workspace, its alignment, and
    "never in C" (indices)."""
    rec = None
    try:
        ends = (pl.launches[0], pl.launches[-1])
        funcs = [int(lc.func) for lc in ends]
        fins = [finish(lc) if finish is not None else None for lc in ends]
        fins = [None if f is None else (int(f[0]),) + tuple(f[1:]) for f in fins]
    except (TypeError, ValueError):
        funcs = None
    if funcs is not None and len(ptr_fields) <= 4:
        rec = PkRec()
        for i, (lc, f, fin) in enumerate(zip(ends, funcs, fins)):
            L = rec.l[i]
            L.func, L.argv, L.params = f, lc.argv[1], ctypes.addressof(lc.params)
            L.grid[:], L.block[:] = list(lc.grid), list(lc.block)
            if fin is not None:
                L.finish = fin[0]
                L.fgrid[:], L.fblock[:] = list(fin[1]), list(fin[2])
        rec.nl = 2 if len(pl.launches) > 1 else 1
        rec.align = int(congruent) if align is None else align
        rec.isz = pl.itemsize if isz is None else isz
        rec.nfield = len(ptr_fields)
        rec.flags_or, rec.ws_need, rec.ws_align, rec.decline = flags_or, ws_need, ws_align, int(decline)
        rec.ptr_off[:len(ptr_fields)] = [getattr(params_type, f).offset for f in ptr_fields]
        rec.alpha_off, rec.beta_off = params_type.alpha.offset, params_type.beta.offset
        rec.flags_off, rec.flags_keep, rec.flag_beta = params_type.flags.offset, flags_keep & 0xFFFFFFFF, flag_beta
    pl.crec_obj = rec
    pl.crec = ctypes.addressof(rec) if rec is not None else 0
    return pl.crec


_u32 = ctypes.c_uint32


class CvRec(ctypes.Structure):
    """cv_rec_t: a convolution's one-launch plan (and its fold) as run_plan patches them (cv_core)."""
    _fields_ = ([(n, ctypes.c_uint64) for n in ("func", "argv", "params", "ffunc", "fargv", "fparams")]
                + [("grid", _u32 * 3), ("block", _u32 * 3), ("smem", _u32), ("fgrid", _u32 * 3), ("fblock", _u32 * 3)]
                + [(n, _u32) for n in ("isz", "align", "pair_ok", "flag_beta", "flag_pair", "x_off", "w_off",
                                       "out_off", "z_off", "bias_off", "alpha_off", "beta_off", "flags_off",
                                       "f_out_off", "f_in_off", "f_alpha_off", "f_beta_off", "f_flags_off")]
                + [("ws_need", ctypes.c_uint64), ("ws_align", ctypes.c_uint64)])


def conv_record(pl, fold_type, flag_beta, flag_pair, threads_fold=256):
    """A CvRec for a convolution plan (plans.Plan) whose kernels are loaded: its gemm launch, and its fold's when
    the fold is a fold_type struct (run_plan's split-K fold; any other fold, or a kernel that is not a driver
    function - a CPU handle's placeholder -: None). Kept by the caller with the plan."""
    try:
        func = int(pl.gemm_func)
        ffunc = int(pl.fold_func) if pl.fold is not None else 0
    except (TypeError, ValueError):
        return None
    if pl.fold is not None and type(pl.fold) is not fold_type:
        return None
    p, r = pl.gemm, CvRec()
    r.func, r.argv, r.params = func, pl.gemm_argv[1], ctypes.addressof(p)
    r.grid[:], r.block[:], r.smem = list(pl.gemm_grid), [pl.threads, 1, 1], pl.smem
    pt = type(p)
    r.x_off, r.w_off, r.out_off, r.z_off, r.bias_off = (getattr(pt, n).offset for n in ("x", "w", "out", "z", "bias"))
    r.alpha_off, r.beta_off, r.flags_off = pt.alpha.offset, pt.beta.offset, pt.flags.offset
    if pl.fold is not None:
        f = pl.fold
        r.ffunc, r.fargv, r.fparams = ffunc, pl.fold_argv[1], ctypes.addressof(f)
        r.fgrid[:], r.fblock[:] = list(pl.fold_grid), [threads_fold, 1, 1]
        r.f_out_off, r.f_in_off, r.f_alpha_off, r.f_beta_off, r.f_flags_off = (
            getattr(fold_type, n).offset for n in ("out", "in_", "alpha", "beta", "flags"))
    r.isz, r.align, r.pair_ok = pl.itemsize, pl.align or 0, int(bool(pl.pair_ok))
    r.flag_beta, r.flag_pair = flag_beta, flag_pair
    r.ws_need, r.ws_align = pl.workspace, pl.acc_size if pl.workspace else 0
    return r


class BnLaunch(ctypes.Structure):
    _fields_ = [("func", ctypes.c_uint64), ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3),
                ("nfield", ctypes.c_uint32), ("pad_", ctypes.c_uint32), ("off", ctypes.c_uint32 * 8),
                ("size", ctypes.c_uint32 * 8), ("val", ctypes.c_uint64 * 8)]


class BnRec(ctypes.Structure):
    """bn_rec_t: batch_normalization_forward_inference's plan as its cached call launches it (bn_core)."""
    _fields_ = [("tier", BnLaunch * 3), ("params", ctypes.c_uint64), ("argv", ctypes.c_uint64), ("xs", ctypes.c_uint64),
                ("ys", ctypes.c_uint64), ("pbytes", ctypes.c_uint64), ("isz", ctypes.c_uint32), ("asz", ctypes.c_uint32),
                ("vm_bytes", ctypes.c_uint32), ("flags_off", ctypes.c_uint32), ("flags_base", ctypes.c_uint32),
                ("flag_beta", ctypes.c_uint32), ("eps_off", ctypes.c_uint32), ("alpha_off", ctypes.c_uint32),
                ("min_eps", ctypes.c_double)]


def bn_infer_record(pl, params_type, seqs, xs, ys, pbytes, vm_bytes, flag_beta, min_eps):
    """Set pl.crec / pl.crec_obj (a BnRec; 0 where a kernel is a CPU handle's placeholder or a tier is not one launch)
    for batch norm inference: seqs the launch sequence _pick chooses for a 16-byte aligned x | y, one aligned to the
    mid vector width (vm_bytes; 0: none), and the rest; a launch whose kernel is not loaded yet is left 0 (bn_core
    declines it: the Python function loads it)."""
    # one BnRec a plan, rewritten in place: a call-site slot holds its address (a new struct would leave the slot
    # pointing at freed memory); a tier it cannot serve keeps func 0 (bn_core declines it)
    rec = pl.crec_obj if isinstance(getattr(pl, "crec_obj", None), BnRec) else BnRec()
    ctypes.memset(ctypes.addressof(rec), 0, ctypes.sizeof(rec))
    ok = all(len(seq) == 1 for seq in seqs)
    for i, seq in enumerate(seqs if ok else ()):
        lc, L = seq[0], rec.tier[i]
        if lc.func is not None:
            try:
                L.func = int(lc.func)
            except (TypeError, ValueError):
                ok = False
                break
        L.grid[:], L.block[:] = list(lc.grid), list(lc.block)
        fields = list(lc.fields.items())
        if len(fields) > 8:
            ok = False
            break
        L.nfield = len(fields)
        for j, (k, v) in enumerate(fields):
            f = getattr(params_type, k)
            L.off[j], L.size[j], L.val[j] = f.offset, f.size, int(v) & 0xFFFFFFFFFFFFFFFF
    if ok:
        rec.params, rec.argv = ctypes.addressof(pl.params), pl.argv[1]
        rec.xs, rec.ys, rec.pbytes = xs, ys, pbytes
        rec.isz, rec.asz, rec.vm_bytes = pl.isize, pl.asize, vm_bytes
        rec.flags_off, rec.flags_base, rec.flag_beta = params_type.flags.offset, pl.flags, flag_beta
        rec.eps_off, rec.alpha_off, rec.min_eps = params_type.eps.offset, params_type.alpha.offset, min_eps
    else:
        ctypes.memset(ctypes.addressof(rec), 0, ctypes.sizeof(rec))
    pl.crec_obj = rec
    pl.crec = ctypes.addressof(rec)
    return pl.crec


class NmLaunch(ctypes.Structure):
    _fields_ = [("func", ctypes.c_uint64), ("argv", ctypes.c_uint64), ("params", ctypes.c_uint64),
                ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint32),
                ("pad_", ctypes.c_uint32)]


class NmRec(ctypes.Structure):
    """nm_rec_t: norm_forward_inference's plan as its cached call launches it (nm_core)."""
    _fields_ = [("alt", (NmLaunch * 4) * 2), ("nl", ctypes.c_uint32 * 2), ("nalt", ctypes.c_uint32),
                ("vec_first", ctypes.c_uint32), ("xs", ctypes.c_uint64), ("ys", ctypes.c_uint64), ("sbs", ctypes.c_uint64),
                ("isz", ctypes.c_uint32), ("flags_off", ctypes.c_uint32), ("flags_clear", ctypes.c_uint32),
                ("flag_beta", ctypes.c_uint32)]


def norm_infer_record(pl, params_type, xs, ys, sbs, flags_clear, flag_beta):
    """Set pl.crec / pl.crec_obj (an NmRec, one a plan rewritten in place as bn_infer_record's) for normalization
    inference: the plan's first and last alternatives (up to 4 launches each; a launch whose kernel is not loaded
    yet, or a CPU handle's placeholder, leaves its alternative unusable: nm_core declines it)."""
    rec = pl.crec_obj if isinstance(getattr(pl, "crec_obj", None), NmRec) else NmRec()
    ctypes.memset(ctypes.addressof(rec), 0, ctypes.sizeof(rec))
    alts = (pl.alternatives[0], pl.alternatives[-1])
    for a, alt in enumerate(alts):
        if len(alt) > 4:
            continue
        try:
            funcs = [int(lc.func) if lc.func is not None else 0 for lc in alt]
        except (TypeError, ValueError):
            continue
        for i, (lc, f) in enumerate(zip(alt, funcs)):
            L = rec.alt[a][i]
            L.func, L.argv, L.params, L.smem = f, lc.argv[1], ctypes.addressof(lc.params), lc.smem
            L.grid[:], L.block[:] = list(lc.grid), list(lc.block)
        rec.nl[a] = len(alt)
    rec.nalt, rec.vec_first = (2 if len(pl.alternatives) > 1 else 1), int(bool(pl.vec_first))
    rec.xs, rec.ys, rec.sbs, rec.isz = xs, ys, sbs, pl.itemsize
    rec.flags_off, rec.flags_clear, rec.flag_beta = params_type.flags.offset, flags_clear, flag_beta
    pl.crec_obj = rec
    pl.crec = ctypes.addressof(rec)
    return pl.crec


def map_entries(fallbacks):
    """{name: compiled entry over fallbacks[name]} for the MAP_KINDS named, and the module's map_note; None where
    the helper has none or act_setup has not run (activation_entry first: the module objects the kinds read)."""
    lib = _state.get("lib")
    if lib is None or not hasattr(lib, "map_entry") or not lib.map_setup():
        return None
    import functools

    return ({name: functools.update_wrapper(lib.map_entry(MAP_KINDS[name], f), f) for name, f in fallbacks.items()},
            lib.map_note)


def driver_launch_untouched():
    return driver.launch_args is _LAUNCH_ARGS and not driver._recorders


_LAUNCH_ARGS = driver.launch_args
