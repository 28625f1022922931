/*
 * blockprep.engine._kernel: the table kernel in C (CPython C API and the buffer protocol only).
 *
 * The specification is blockprep/engine/twin.py: the same class, the same methods, the same
 * results (buffers, held ids, counters, faults), errors included. Read its module docstring for
 * the rules; this file only says where the C differs in how, never in what.
 *
 * State of one GroupKernel (one cache group):
 *   held  [rows * stride] int32  the ids each row holds as of the latest commit (stride: the
 *                                longest row so far, at most width, so the state stays compact)
 *   lens  [rows]         int32   how many (-1: unknown)
 *   marks [slots * rows * MARK]  per slot and row: mode, count, p0..p3 (SPAN: p0 = lo, p1 = hi)
 * A plan is a bytes object of int32 records: row, n, mode, count, p0..p3, then the n new ids.
 * commit() validates every record and both buffers before its first write, so a plan that is
 * not one this kernel staged is a ValueError, never an out-of-bounds write.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h>
#endif

enum { PADDING = -2, NEW = -1 };
enum { F_TYPE = 1, F_LENGTH = 2, F_RANGE = 3, F_REPEAT = 4, F_PAD_RANGE = 5, F_OPS = 6 };
enum { CLEAN = 0, POSITIONS = 1, SPAN = 2, WHOLE = 3 };
#define MAX_POSITIONS 4
#define MARK 6   /* mode, count, p0..p3 */
#define HEADER 8 /* row, n, mode, count, p0..p3 */
#define CHECKED 16 /* record mode flag: a request's row, checked (padding rows are trusted) */
#define STAMP_LIMIT (1 << 22) /* pools up to this many ids get a stamp table (16 MiB at most) */
#define BIG LLONG_MIN /* stands for an int beyond int64: out of every range */

typedef struct {
    PyObject_HEAD
    int ring;
    Py_ssize_t width, shortest, rows, slots;
    Py_ssize_t stride; /* held row stride: grows with the longest row, at most width */
    long long limit;
    int32_t pad;
    int32_t *held;
    int32_t *lens;
    uint8_t *checked; /* rows: the held ids were checked as a request's (so hold no repeats) */
    int32_t *marks;
    uint32_t *stamps;    /* [limit] generation stamps for the repeat check (NULL: limit too big) */
    uint32_t generation;
} GroupKernel;

/* ---- small helpers --------------------------------------------------------------------------- */

/* The value of an exact int; BIG when it does not fit in a long long. Never fails. */
static inline long long exact_value(PyObject *x)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)x))
        return (long long)PyUnstable_Long_CompactValue((PyLongObject *)x);
#else
    Py_ssize_t size = Py_SIZE(x); /* digits, signed: one digit holds 30 bits */
    if (size == 0)
        return 0;
    if (size == 1)
        return (long long)((PyLongObject *)x)->ob_digit[0];
    if (size == -1)
        return -(long long)((PyLongObject *)x)->ob_digit[0];
#endif
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    return overflow ? BIG : v;
}

/* An exact int argument in [lo, hi) as a Py_ssize_t; -1 with an exception otherwise. */
static int int_arg(PyObject *x, const char *name, long long lo, long long hi, long long *out)
{
    if (!PyLong_CheckExact(x)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %s", name, Py_TYPE(x)->tp_name);
        return -1;
    }
    long long v = exact_value(x);
    if (v == BIG || v < lo || v >= hi) {
        PyErr_Format(PyExc_IndexError, "%s %R out of range [%lld, %lld)", name, x, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* A writable C-contiguous 2-D int32 buffer with rows rows (and width columns unless width < 0). */
static int get_table(PyObject *obj, Py_buffer *view, Py_ssize_t rows, Py_ssize_t width,
                     const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS) < 0) { /* writable, strides, format */
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a 2-D int32 array", name);
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (*f == '=' || *f == '<' || *f == '@')
        f++;
    int int32 = view->itemsize == 4 && ((f[0] == 'i' && !f[1]) || (f[0] == 'l' && !f[1] && sizeof(long) == 4));
    if (!int32 || view->ndim != 2) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s must be a 2-D int32 array", name);
        return -1;
    }
    if (view->shape[0] != rows || (width >= 0 && view->shape[1] != width)) {
        PyErr_Format(PyExc_ValueError, "%s must have %zd rows and %zd columns, got %zd x %zd",
                     name, rows, width, view->shape[0], view->shape[1]);
        PyBuffer_Release(view);
        return -1;
    }
    if (!PyBuffer_IsContiguous(view, 'C') || view->readonly) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous and writable", name);
        return -1;
    }
    return 0;
}

static PyObject *fault(int code, Py_ssize_t row, PyObject *value)
{
    /* (None, (code, row, value)); steals nothing: value is borrowed. */
    return Py_BuildValue("(O(inO))", Py_None, code, row, value);
}

/* ---- the type -------------------------------------------------------------------------------- */

static void kernel_dealloc(GroupKernel *self)
{
    PyMem_Free(self->held);
    PyMem_Free(self->lens);
    PyMem_Free(self->checked);
    PyMem_Free(self->marks);
    PyMem_Free(self->stamps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void mark_all(GroupKernel *self, Py_ssize_t slot)
{
    Py_ssize_t first = slot < 0 ? 0 : slot, last = slot < 0 ? self->slots : slot + 1;
    for (Py_ssize_t s = first; s < last; s++)
        for (Py_ssize_t r = 0; r < self->rows; r++) {
            int32_t *mk = self->marks + (s * self->rows + r) * MARK;
            mk[0] = WHOLE;
            mk[1] = 0;
        }
}

static int kernel_init(GroupKernel *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"ring", "width", "limit", "shortest", "pad", "rows", "slots", NULL};
    PyObject *ring, *o[6];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOO", names, &ring, &o[0], &o[1], &o[2],
                                     &o[3], &o[4], &o[5]))
        return -1;
    static const char *fields[] = {"width", "limit", "shortest", "pad", "rows", "slots"};
    long long v[6];
    for (int i = 0; i < 6; i++) {
        if (!PyLong_CheckExact(o[i])) {
            PyErr_Format(PyExc_TypeError, "%s must be an int, got %s", fields[i],
                         Py_TYPE(o[i])->tp_name);
            return -1;
        }
        v[i] = exact_value(o[i]);
    }
    long long width = v[0], limit = v[1], shortest = v[2], pad = v[3], rows = v[4], slots = v[5];
    if (!(0 < width && width <= INT32_MAX) || !(0 < limit && limit <= (long long)INT32_MAX + 1)) {
        PyErr_Format(PyExc_ValueError,
                     "width must be in [1, 2**31) and limit in [1, 2**31], got %R, %R", o[0], o[1]);
        return -1;
    }
    if (!(0 <= shortest && shortest <= width) || !(INT32_MIN <= pad && pad <= INT32_MAX)) {
        PyErr_Format(PyExc_ValueError,
                     "shortest must be in [0, width] and pad an int32, got %R, %R", o[2], o[3]);
        return -1;
    }
    if (rows < 0 || slots <= 0 || rows > INT32_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "rows must be non-negative and slots positive, got %R, %R", o[4], o[5]);
        return -1;
    }
    int truth = PyObject_IsTrue(ring);
    if (truth < 0)
        return -1;
    /* Sizes checked against overflow before allocating: rows * width int32 cells. */
    if ((size_t)rows > PY_SSIZE_T_MAX / sizeof(int32_t) / (size_t)width ||
        (size_t)slots > PY_SSIZE_T_MAX / sizeof(int32_t) / MARK / ((size_t)rows + 1)) {
        PyErr_SetString(PyExc_MemoryError, "table too large");
        return -1;
    }
    PyMem_Free(self->held);
    PyMem_Free(self->lens);
    PyMem_Free(self->checked);
    PyMem_Free(self->marks);
    PyMem_Free(self->stamps);
    self->stamps = NULL;
    if (limit <= STAMP_LIMIT && !(self->stamps = PyMem_Calloc((size_t)limit, sizeof(uint32_t)))) {
        PyErr_NoMemory();
        return -1;
    }
    self->generation = 0;
    self->stride = width < 128 ? (Py_ssize_t)width : 128;
    self->held = PyMem_Malloc(sizeof(int32_t) * (size_t)(rows * self->stride + 1));
    self->lens = PyMem_Malloc(sizeof(int32_t) * (size_t)(rows + 1));
    self->checked = PyMem_Calloc((size_t)rows + 1, 1);
    self->marks = PyMem_Malloc(sizeof(int32_t) * (size_t)(slots * rows * MARK + 1));
    if (!self->held || !self->lens || !self->checked || !self->marks) {
        PyErr_NoMemory();
        return -1;
    }
    self->ring = truth;
    self->width = (Py_ssize_t)width;
    self->limit = limit;
    self->shortest = (Py_ssize_t)shortest;
    self->pad = (int32_t)pad;
    self->rows = (Py_ssize_t)rows;
    self->slots = (Py_ssize_t)slots;
    for (Py_ssize_t r = 0; r < self->rows; r++)
        self->lens[r] = -1;
    mark_all(self, -1);
    return 0;
}

/* Room for rows of n ids in held (n <= width): a wider stride, rows copied. Changes no value. */
static int grow_held(GroupKernel *self, Py_ssize_t n)
{
    if (n <= self->stride)
        return 0;
    Py_ssize_t stride = self->stride * 2 > n ? self->stride * 2 : n;
    if (stride > self->width)
        stride = self->width;
    int32_t *held = PyMem_Malloc(sizeof(int32_t) * (size_t)(self->rows * stride + 1));
    if (!held) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t r = 0; r < self->rows; r++)
        if (self->lens[r] > 0)
            memcpy(held + r * stride, self->held + r * self->stride,
                   sizeof(int32_t) * (size_t)self->lens[r]);
    PyMem_Free(self->held);
    self->held = held;
    self->stride = stride;
    return 0;
}

/* ---- reading --------------------------------------------------------------------------------- */

static PyObject *kernel_held(GroupKernel *self, PyObject *arg)
{
    long long r;
    if (int_arg(arg, "row", 0, self->rows, &r) < 0)
        return NULL;
    int32_t n = self->lens[r];
    if (n < 0)
        Py_RETURN_NONE;
    PyObject *out = PyList_New(n);
    if (!out)
        return NULL;
    const int32_t *ids = self->held + r * self->stride;
    for (int32_t p = 0; p < n; p++) {
        PyObject *x = PyLong_FromLong(ids[p]);
        if (!x) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, p, x);
    }
    return out;
}

static PyObject *kernel_length(GroupKernel *self, PyObject *arg)
{
    long long r;
    if (int_arg(arg, "row", 0, self->rows, &r) < 0)
        return NULL;
    return PyLong_FromLong(self->lens[r]);
}

/* ---- stage ----------------------------------------------------------------------------------- */

typedef struct {
    int32_t *out; /* the plan's records */
    Py_ssize_t used, cap;
    long long *vals;  /* one row's ids */
    PyObject **objs;  /* a row built from ops: its id objects (owned), NULL for a held id */
    Py_ssize_t nobjs; /* objs[0..nobjs) hold references */
    Py_ssize_t *chg;  /* its changed positions */
    uint64_t *keys;   /* (value, position) pairs for the repeat check */
    Py_ssize_t row_cap;
} Scratch;

static void scratch_drop_objs(Scratch *s, Py_ssize_t from)
{
    for (Py_ssize_t p = from; p < s->nobjs; p++)
        Py_CLEAR(s->objs[p]);
    if (from < s->nobjs)
        s->nobjs = from;
}

static void scratch_free(Scratch *s)
{
    scratch_drop_objs(s, 0);
    PyMem_Free(s->out);
    PyMem_Free(s->vals);
    PyMem_Free(s->objs);
    PyMem_Free(s->chg);
    PyMem_Free(s->keys);
}

/* Room for rows of n ids, keeping what the row arrays hold. */
static int scratch_row(Scratch *s, Py_ssize_t n)
{
    if (n <= s->row_cap)
        return 0;
    Py_ssize_t cap = s->row_cap ? s->row_cap : 64;
    while (cap < n) {
        if (cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(uint64_t)) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    long long *vals = PyMem_Realloc(s->vals, sizeof(long long) * (size_t)cap);
    if (vals)
        s->vals = vals;
    PyObject **objs = PyMem_Realloc(s->objs, sizeof(PyObject *) * (size_t)cap);
    if (objs)
        s->objs = objs;
    Py_ssize_t *chg = PyMem_Realloc(s->chg, sizeof(Py_ssize_t) * (size_t)cap);
    if (chg)
        s->chg = chg;
    uint64_t *keys = PyMem_Realloc(s->keys, sizeof(uint64_t) * (size_t)cap);
    if (keys)
        s->keys = keys;
    if (!vals || !objs || !chg || !keys) {
        PyErr_NoMemory();
        return -1;
    }
    s->row_cap = cap;
    return 0;
}

static int32_t *scratch_record(Scratch *s, Py_ssize_t n)
{
    Py_ssize_t need = s->used + HEADER + n;
    if (need > s->cap) {
        Py_ssize_t cap = s->cap ? s->cap : 1024;
        while (cap < need)
            cap *= 2;
        int32_t *grown = PyMem_Realloc(s->out, sizeof(int32_t) * (size_t)cap);
        if (!grown) {
            PyErr_NoMemory();
            return NULL;
        }
        s->out = grown;
        s->cap = cap;
    }
    int32_t *rec = s->out + s->used;
    s->used = need;
    return rec;
}

static int compare_keys(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The first position (in order) whose id appeared earlier in vals[0..n), or n. The ids are
 * range-checked (in [0, 2**31)). With few changed positions over a base without repeats, only
 * pairs holding a changed position can be equal. */
static Py_ssize_t first_repeat(GroupKernel *self, Scratch *s, Py_ssize_t n, Py_ssize_t nchg,
                               int base_distinct)
{
    const long long *vals = s->vals;
    Py_ssize_t best = n;
    if (self->stamps && !(base_distinct && nchg <= MAX_POSITIONS)) {
        /* One pass over a table of generation stamps per id (ids are in [0, limit) here). */
        if (++self->generation == 0) {
            memset(self->stamps, 0, sizeof(uint32_t) * (size_t)self->limit);
            self->generation = 1;
        }
        Py_ssize_t p = 0;
        for (; p < n; p++) {
            if (vals[p] < 0 || vals[p] >= self->limit)
                break; /* a held id from a row never checked: the sort below decides */
            uint32_t *stamp = self->stamps + vals[p];
            if (*stamp == self->generation)
                return p;
            *stamp = self->generation;
        }
        if (p == n)
            return n;
    }
    if (base_distinct && nchg <= MAX_POSITIONS) {
        for (Py_ssize_t i = 0; i < nchg; i++) {
            Py_ssize_t c = s->chg[i];
            for (Py_ssize_t k = 0; k < n; k++)
                if (k != c && vals[k] == vals[c]) {
                    Py_ssize_t j = k > c ? k : c;
                    if (j < best)
                        best = j;
                }
        }
        return best;
    }
    for (Py_ssize_t p = 0; p < n; p++)
        s->keys[p] = ((uint64_t)(uint32_t)vals[p] << 32) | (uint64_t)p;
    qsort(s->keys, (size_t)n, sizeof(uint64_t), compare_keys);
    /* In a run of equal ids (sorted by position), the second position is the first repeat. */
    for (Py_ssize_t p = 1; p < n; p++) {
        uint64_t id = s->keys[p] >> 32;
        if (id == (s->keys[p - 1] >> 32) && (p == 1 || id != (s->keys[p - 2] >> 32))) {
            Py_ssize_t j = (Py_ssize_t)(s->keys[p] & 0xffffffffu);
            if (j < best)
                best = j;
        }
    }
    return best;
}

/* The value object of position p for a fault: the exact int itself, or convert(x) again. */
static PyObject *value_at(Scratch *s, PyObject *lst, Py_ssize_t p, PyObject *convert)
{
    PyObject *x = lst ? PyList_GET_ITEM(lst, p) : s->objs[p];
    if (!x)
        return PyLong_FromLongLong(s->vals[p]);
    if (PyLong_CheckExact(x)) {
        Py_INCREF(x);
        return x;
    }
    return PyObject_CallOneArg(convert, x);
}

/* Decide one visited row: append its record to s->out (or nothing: unchanged). Its n ids are
 * the items of lst (the caller's list) or, with lst NULL, the cells s->objs (NULL cells: a held
 * id, already in s->vals). Returns 0, 1 with *fault_out set, or -1 with an exception. */
static int stage_row(GroupKernel *self, Scratch *s, Py_ssize_t r, PyObject *lst, Py_ssize_t n,
                     long long src, PyObject *convert, PyObject **fault_out)
{
    const Py_ssize_t W = self->width;
    if (n <= W && grow_held(self, n) < 0) /* before any pointer into held is taken */
        return -1;
    const Py_ssize_t stride = self->stride;
    const int padding = src == PADDING;
    const int32_t *base = NULL;
    Py_ssize_t m = 0;
    long long from = src >= 0 ? src : (padding ? r : -1);
    if (from >= 0 && self->lens[from] >= 0) {
        base = self->held + from * stride;
        m = self->lens[from];
    }
    if (scratch_row(s, n) < 0)
        return -1;
    long long *vals = s->vals;
    Py_ssize_t nchg = 0;
    /* 1. ids: unchanged ones are the held ids; changed ones plain ints (others converted). */
    for (Py_ssize_t p = 0; p < n; p++) {
        PyObject *x = lst ? PyList_GET_ITEM(lst, p) : s->objs[p];
#if defined(__GNUC__)
        if (lst && p + 8 < n) /* the ids are scattered objects: fetch ahead of the walk */
            __builtin_prefetch(PyList_GET_ITEM(lst, p + 8));
#endif
        long long v;
        if (!x) { /* a held id the ops kept */
            v = vals[p];
            if (p < m && v == base[p])
                continue;
        } else if (PyLong_CheckExact(x)) {
            v = exact_value(x);
            if (p < m && v == base[p]) {
                vals[p] = v;
                continue;
            }
        } else {
            /* Callbacks may run any code: hold x, and check the row kept its size. */
            Py_INCREF(x);
            int equal = 0;
            if (p < m) {
                PyObject *h = PyLong_FromLong(base[p]);
                if (!h) {
                    Py_DECREF(x);
                    return -1;
                }
                equal = PyObject_RichCompareBool(x, h, Py_EQ);
                Py_DECREF(h);
                if (equal < 0) {
                    PyErr_Clear();
                    equal = 0;
                }
            }
            PyObject *c = NULL;
            if (!equal) {
                c = PyObject_CallOneArg(convert, x);
                if (!c) {
                    Py_DECREF(x);
                    return -1;
                }
            }
            if (lst && PyList_GET_SIZE(lst) != n) {
                Py_XDECREF(c);
                Py_DECREF(x);
                PyErr_Format(PyExc_RuntimeError, "row %zd changed while it was planned", r);
                return -1;
            }
            if (equal) {
                Py_DECREF(x);
                vals[p] = base[p];
                continue;
            }
            if (!PyLong_CheckExact(c)) {
                *fault_out = fault(F_TYPE, r, x);
                Py_DECREF(c);
                Py_DECREF(x);
                return *fault_out ? 1 : -1;
            }
            v = exact_value(c);
            Py_DECREF(c);
            Py_DECREF(x);
        }
        vals[p] = v;
        s->chg[nchg++] = p;
    }
    if (from == r && base && nchg == 0 && n == m)
        return 0; /* it holds exactly what it held: nothing to check or write (as the twin) */
    /* 2. length, 3. range, 4. repeats. */
    int bad_length = padding ? (n > W || (self->ring && n == 0))
                             : (n < self->shortest || n > W);
    if (bad_length) {
        PyObject *value = PyLong_FromSsize_t(n);
        if (!value)
            return -1;
        *fault_out = fault(F_LENGTH, r, value);
        Py_DECREF(value);
        return *fault_out ? 1 : -1;
    }
    for (Py_ssize_t i = 0; i < nchg; i++) {
        long long v = vals[s->chg[i]];
        int bad = padding ? (v == BIG || v < INT32_MIN || v > INT32_MAX)
                          : (v == BIG || v < 0 || v >= self->limit);
        if (bad) {
            PyObject *value = value_at(s, lst, s->chg[i], convert);
            if (!value)
                return -1;
            *fault_out = fault(padding ? F_PAD_RANGE : F_RANGE, r, value);
            Py_DECREF(value);
            return *fault_out ? 1 : -1;
        }
    }
    if (!padding && nchg) {
        Py_ssize_t j = first_repeat(self, s, n, nchg, src >= 0 && self->checked[src]);
        if (j < n) {
            PyObject *value = PyLong_FromLongLong(vals[j]);
            if (!value)
                return -1;
            *fault_out = fault(F_REPEAT, r, value);
            Py_DECREF(value);
            return *fault_out ? 1 : -1;
        }
    }
    /* The mark: what a slot holding a render of row r's held ids must write. */
    int32_t om = self->lens[r];
    const int32_t *old = self->held + r * stride;
    int32_t mode, count = 0, pos[MAX_POSITIONS] = {0, 0, 0, 0}, lo = -1, hi = -1;
    if (om < 0 || (self->ring && om != n)) {
        mode = WHOLE;
    } else {
        Py_ssize_t shorter = n < om ? n : om, longer = n < om ? om : n, differ = 0;
        for (Py_ssize_t p = 0; p < longer; p++) {
            if (p < shorter && vals[p] == old[p])
                continue;
            if (differ < MAX_POSITIONS)
                pos[differ] = (int32_t)p;
            if (lo < 0)
                lo = (int32_t)p;
            hi = (int32_t)p + 1;
            differ++;
        }
        if (!differ)
            return 0; /* it holds exactly what it held */
        if (differ <= MAX_POSITIONS) {
            mode = POSITIONS;
            count = (int32_t)differ;
        } else if (self->ring) {
            mode = WHOLE;
        } else {
            mode = SPAN;
            pos[0] = lo;
            pos[1] = hi;
        }
    }
    int32_t *rec = scratch_record(s, n);
    if (!rec)
        return -1;
    rec[0] = (int32_t)r;
    rec[1] = (int32_t)n;
    rec[2] = mode | (padding ? 0 : CHECKED);
    rec[3] = count;
    memcpy(rec + 4, pos, sizeof pos);
    for (Py_ssize_t p = 0; p < n; p++)
        rec[HEADER + p] = (int32_t)vals[p];
    return 0;
}

static PyObject *kernel_stage(GroupKernel *self, PyObject *args)
{
    PyObject *rows, *lists, *srcs, *convert;
    if (!PyArg_ParseTuple(args, "OOOO:stage", &rows, &lists, &srcs, &convert))
        return NULL;
    if (!PyList_CheckExact(lists) || !PyList_CheckExact(srcs) ||
        (rows != Py_None && !PyList_CheckExact(rows))) {
        PyErr_SetString(PyExc_TypeError, "rows (or None), lists and srcs must be lists");
        return NULL;
    }
    if (PyList_GET_SIZE(srcs) != self->rows) {
        PyErr_Format(PyExc_ValueError, "srcs must hold %zd rows, got %zd", self->rows,
                     PyList_GET_SIZE(srcs));
        return NULL;
    }
    Py_ssize_t visits = rows == Py_None ? self->rows : PyList_GET_SIZE(rows);
    if (PyList_GET_SIZE(lists) != visits) {
        PyErr_Format(PyExc_ValueError, "lists must hold %zd rows, got %zd", visits,
                     PyList_GET_SIZE(lists));
        return NULL;
    }
    Scratch s = {0};
    PyObject *fault_value = NULL, *result = NULL;
    for (Py_ssize_t i = 0; i < visits; i++) {
        long long r = i, src;
        if (rows != Py_None && int_arg(PyList_GET_ITEM(rows, i), "row", 0, self->rows, &r) < 0)
            goto done;
        /* lists, srcs and rows are the caller's: re-read their sizes after any callback. */
        if (i >= PyList_GET_SIZE(lists) || PyList_GET_SIZE(srcs) != self->rows) {
            PyErr_SetString(PyExc_RuntimeError, "the step changed while it was planned");
            goto done;
        }
        PyObject *lst = PyList_GET_ITEM(lists, i);
        if (!PyList_CheckExact(lst)) {
            PyErr_Format(PyExc_TypeError, "row %lld must be a list, got %s", r,
                         Py_TYPE(lst)->tp_name);
            goto done;
        }
        PyObject *so = PyList_GET_ITEM(srcs, r);
        if (!PyLong_CheckExact(so) || (src = exact_value(so), !(src == PADDING || src == NEW ||
                                                                (0 <= src && src < self->rows)))) {
            PyErr_Format(PyExc_ValueError, "srcs[%lld] must be -2, -1 or a row, got %R", r, so);
            goto done;
        }
        Py_INCREF(lst);
        int status = stage_row(self, &s, (Py_ssize_t)r, lst, PyList_GET_SIZE(lst), src, convert,
                               &fault_value);
        Py_DECREF(lst);
        if (status < 0)
            goto done;
        if (status > 0) {
            result = fault_value;
            goto done;
        }
    }
    PyObject *plan = PyBytes_FromStringAndSize((const char *)s.out,
                                               (Py_ssize_t)sizeof(int32_t) * s.used);
    if (plan) {
        result = Py_BuildValue("(NO)", plan, Py_None);
    }
done:
    scratch_free(&s);
    return result;
}

/* ---- stage_ops: rows given as blockprep.wire operations ---------------------------------------- */

static PyObject *TAGS[4]; /* "w", "a", "s", "t" */
enum { OP_W, OP_A, OP_S, OP_T, OP_BAD };

/* The tag of op as apply_ops reads it (op[0] == "w", ...); -1 with an exception. */
static int op_tag(PyObject *op)
{
    if (!PyList_Check(op) || PyList_GET_SIZE(op) == 0)
        return OP_BAD;
    PyObject *tag = PyList_GET_ITEM(op, 0);
    for (int t = 0; t < 4; t++) {
        if (tag == TAGS[t])
            return t;
        if (PyUnicode_CheckExact(tag)) {
            if (PyUnicode_Compare(tag, TAGS[t]) == 0)
                return t;
            continue;
        }
        Py_INCREF(tag);
        int eq = PyObject_RichCompareBool(tag, TAGS[t], Py_EQ);
        Py_DECREF(tag);
        if (eq < 0)
            return -1;
        if (eq)
            return t;
    }
    return OP_BAD;
}

/* Cells [from, n) of s->objs set to new references to the items of ids (an exact list). */
static int put_items(Scratch *s, Py_ssize_t at, PyObject *ids)
{
    Py_ssize_t k = PyList_GET_SIZE(ids);
    if (scratch_row(s, at + k) < 0)
        return -1;
    scratch_drop_objs(s, at);
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *x = PyList_GET_ITEM(ids, i);
        Py_INCREF(x);
        s->objs[at + i] = x;
    }
    s->nobjs = at + k;
    return 0;
}

/* Apply ops to the cells, as wire.apply_ops: *n the length (-1: nothing held). Returns 0, 1 for
 * ops apply_ops rejects, -1 with an exception. */
static int apply_ops(Scratch *s, PyObject *ops, Py_ssize_t *n)
{
    if (!PyList_Check(ops) || PyList_GET_SIZE(ops) == 0)
        return 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        Py_INCREF(op);
        int tag = op_tag(op), status = 0;
        Py_ssize_t size = tag < 0 || tag == OP_BAD ? 0 : PyList_GET_SIZE(op);
        if (tag < 0) {
            status = -1;
        } else if (*n < 0 && tag != OP_W) {
            status = 1;
        } else if ((tag == OP_W || tag == OP_A) && size == 2) {
            PyObject *ids = PyList_GET_ITEM(op, 1);
            if (!PyList_CheckExact(ids))
                status = 1;
            else if (put_items(s, tag == OP_W ? 0 : *n, ids) < 0)
                status = -1;
            else
                *n = s->nobjs;
        } else if (tag == OP_S && size == 3) {
            PyObject *positions = PyList_GET_ITEM(op, 1), *values = PyList_GET_ITEM(op, 2);
            Py_ssize_t k = PyList_CheckExact(positions) ? PyList_GET_SIZE(positions) : -1;
            if (k < 0 || !PyList_CheckExact(values) || PyList_GET_SIZE(values) != k)
                status = 1;
            for (Py_ssize_t j = 0; status == 0 && j < k; j++) {
                PyObject *q = PyList_GET_ITEM(positions, j);
                long long p = PyLong_CheckExact(q) ? exact_value(q) : -1;
                if (p < 0 || p >= *n) {
                    status = 1;
                    break;
                }
                for (Py_ssize_t e = 0; e < j && k > 1; e++) /* positions must not repeat */
                    if (exact_value(PyList_GET_ITEM(positions, e)) == p)
                        status = 1;
            }
            for (Py_ssize_t j = 0; status == 0 && j < k; j++) {
                Py_ssize_t p = (Py_ssize_t)exact_value(PyList_GET_ITEM(positions, j));
                PyObject *x = PyList_GET_ITEM(values, j);
                Py_INCREF(x);
                Py_XSETREF(s->objs[p], x);
            }
        } else if (tag == OP_T && size == 2) {
            PyObject *q = PyList_GET_ITEM(op, 1);
            long long length = PyLong_CheckExact(q) ? exact_value(q) : -1;
            if (length < 0 || length > *n)
                status = 1;
            else {
                scratch_drop_objs(s, (Py_ssize_t)length);
                *n = (Py_ssize_t)length;
            }
        } else {
            status = 1;
        }
        Py_DECREF(op);
        if (status)
            return status;
    }
    return *n < 0 ? 1 : 0;
}

/* The ids an append or a set names are new ids: integers (convert) whatever the row held, in op
 * order; a TYPE fault names the first that is not. Returns 0, 1 with *fault_out, -1. */
static int check_set_ids(PyObject *ops, Py_ssize_t r, PyObject *convert, PyObject **fault_out)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        if (!PyList_Check(op) || PyList_GET_SIZE(op) < 2)
            continue;
        Py_INCREF(op);
        int tag = op_tag(op);
        PyObject *ids = PyList_GET_ITEM(op, PyList_GET_SIZE(op) - 1);
        int status = tag < 0 ? -1 : 0;
        if ((tag == OP_A || tag == OP_S) && PyList_CheckExact(ids)) {
            Py_INCREF(ids);
            for (Py_ssize_t j = 0; status == 0 && j < PyList_GET_SIZE(ids); j++) {
                PyObject *x = PyList_GET_ITEM(ids, j);
                if (PyLong_CheckExact(x))
                    continue;
                Py_INCREF(x);
                PyObject *c = PyObject_CallOneArg(convert, x);
                if (!c)
                    status = -1;
                else if (!PyLong_CheckExact(c))
                    status = (*fault_out = fault(F_TYPE, r, x)) ? 1 : -1;
                Py_XDECREF(c);
                Py_DECREF(x);
            }
            Py_DECREF(ids);
        }
        Py_DECREF(op);
        if (status)
            return status;
    }
    return 0;
}

static PyObject *kernel_stage_ops(GroupKernel *self, PyObject *args)
{
    PyObject *rows, *items, *srcs, *convert;
    if (!PyArg_ParseTuple(args, "OOOO:stage_ops", &rows, &items, &srcs, &convert))
        return NULL;
    if (!PyList_CheckExact(rows) || !PyList_CheckExact(items) || !PyList_CheckExact(srcs)) {
        PyErr_SetString(PyExc_TypeError, "rows, items and srcs must be lists");
        return NULL;
    }
    if (PyList_GET_SIZE(srcs) != self->rows) {
        PyErr_Format(PyExc_ValueError, "srcs must hold %zd rows, got %zd", self->rows,
                     PyList_GET_SIZE(srcs));
        return NULL;
    }
    if (PyList_GET_SIZE(items) != PyList_GET_SIZE(rows)) {
        PyErr_Format(PyExc_ValueError, "items must hold %zd rows, got %zd", PyList_GET_SIZE(rows),
                     PyList_GET_SIZE(items));
        return NULL;
    }
    Scratch s = {0};
    PyObject *fault_value = NULL, *result = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        long long r, src;
        if (int_arg(PyList_GET_ITEM(rows, i), "row", 0, self->rows, &r) < 0)
            goto done;
        if (i >= PyList_GET_SIZE(items) || PyList_GET_SIZE(srcs) != self->rows) {
            PyErr_SetString(PyExc_RuntimeError, "the step changed while it was planned");
            goto done;
        }
        PyObject *so = PyList_GET_ITEM(srcs, r);
        if (!PyLong_CheckExact(so) || (src = exact_value(so), !(src == PADDING || src == NEW ||
                                                                (0 <= src && src < self->rows)))) {
            PyErr_Format(PyExc_ValueError, "srcs[%lld] must be -2, -1 or a row, got %R", r, so);
            goto done;
        }
        PyObject *item = PyList_GET_ITEM(items, i);
        Py_INCREF(item);
        int status;
        if (src == PADDING) { /* a padding row: its ids, by value */
            status = PyList_CheckExact(item)
                         ? stage_row(self, &s, (Py_ssize_t)r, item, PyList_GET_SIZE(item), src,
                                     convert, &fault_value)
                         : (PyErr_Format(PyExc_TypeError, "row %lld must be a list, got %s", r,
                                         Py_TYPE(item)->tp_name),
                            -1);
        } else {
            /* The cells start as the ids the request held (none for a new request). */
            Py_ssize_t n = -1;
            scratch_drop_objs(&s, 0);
            if (src >= 0 && self->lens[src] >= 0) {
                n = self->lens[src];
                status = scratch_row(&s, n);
                for (Py_ssize_t p = 0; status == 0 && p < n; p++) {
                    s.objs[p] = NULL;
                    s.vals[p] = self->held[src * self->stride + p];
                }
                s.nobjs = n;
            } else {
                status = 0;
            }
            if (status == 0 && item != Py_None)
                status = apply_ops(&s, item, &n);
            else if (status == 0 && n < 0)
                status = 1; /* a new request without its whole list */
            if (status == 1)
                fault_value = Py_BuildValue("(O(inO))", Py_None, F_OPS, (Py_ssize_t)r, Py_None);
            else if (status == 0 && item != Py_None)
                status = check_set_ids(item, (Py_ssize_t)r, convert, &fault_value);
            if (status == 0) {
                /* Held cells keep their value in s.vals; the rest read from s.objs. */
                status = stage_row(self, &s, (Py_ssize_t)r, NULL, n, src, convert, &fault_value);
            }
            if (status == 1 && !fault_value)
                status = -1;
        }
        Py_DECREF(item);
        if (status < 0)
            goto done;
        if (status > 0) {
            result = fault_value;
            goto done;
        }
    }
    PyObject *plan = PyBytes_FromStringAndSize((const char *)s.out,
                                               (Py_ssize_t)sizeof(int32_t) * s.used);
    if (plan)
        result = Py_BuildValue("(NO)", plan, Py_None);
done:
    scratch_free(&s);
    return result;
}

/* ---- commit ---------------------------------------------------------------------------------- */

static void mark_span(const int32_t *mk, int32_t *lo, int32_t *hi)
{
    if (mk[0] == SPAN) {
        *lo = mk[2];
        *hi = mk[3];
        return;
    }
    *lo = mk[2];
    *hi = mk[2] + 1;
    for (int32_t i = 1; i < mk[1]; i++) {
        if (mk[2 + i] < *lo)
            *lo = mk[2 + i];
        if (mk[2 + i] + 1 > *hi)
            *hi = mk[2 + i] + 1;
    }
}

/* A slot's mark after another change (mode, count, positions) of its row: as twin._merged. */
static void merge(int32_t *mk, const int32_t *change, int ring)
{
    int32_t mode = change[0];
    if (mk[0] == CLEAN) {
        memcpy(mk, change, sizeof(int32_t) * MARK);
        return;
    }
    if (mk[0] == WHOLE || mode == WHOLE) {
        mk[0] = WHOLE;
        mk[1] = 0;
        return;
    }
    if (mk[0] == POSITIONS && mode == POSITIONS) {
        int32_t u[2 * MAX_POSITIONS];
        int32_t k = 0;
        for (int32_t i = 0; i < mk[1]; i++)
            u[k++] = mk[2 + i];
        for (int32_t i = 0; i < change[1]; i++) {
            int seen = 0;
            for (int32_t j = 0; j < mk[1]; j++)
                seen |= mk[2 + j] == change[2 + i];
            if (!seen)
                u[k++] = change[2 + i];
        }
        if (k <= MAX_POSITIONS) {
            mk[1] = k;
            memcpy(mk + 2, u, sizeof(int32_t) * (size_t)k);
            return;
        }
        if (ring) {
            mk[0] = WHOLE;
            mk[1] = 0;
            return;
        }
    }
    int32_t lo, hi, lo2, hi2;
    mark_span(mk, &lo, &hi);
    mark_span(change, &lo2, &hi2);
    mk[0] = SPAN;
    mk[1] = 0;
    mk[2] = lo < lo2 ? lo : lo2;
    mk[3] = hi > hi2 ? hi : hi2;
}

/* Row r of the table: dst[j] = ids[j % n] by a doubling copy (the filled prefix, a multiple of
 * n long, copied onwards). */
static void tile(int32_t *dst, const int32_t *ids, Py_ssize_t n, Py_ssize_t width)
{
    memcpy(dst, ids, sizeof(int32_t) * (size_t)n);
    Py_ssize_t filled = n;
    while (filled < width) {
        Py_ssize_t c = filled < width - filled ? filled : width - filled;
        memcpy(dst + filled, dst, sizeof(int32_t) * (size_t)c);
        filled += c;
    }
}

/* Render slot's marked rows into table; returns the cells written, appends rows to `written`. */
static long long render(GroupKernel *self, Py_ssize_t slot, int32_t *table, Py_ssize_t *count,
                        PyObject *written)
{
    const Py_ssize_t W = self->width;
    long long cells = 0;
    *count = 0;
    for (Py_ssize_t r = 0; r < self->rows; r++) {
        int32_t *mk = self->marks + (slot * self->rows + r) * MARK;
        if (mk[0] == CLEAN)
            continue;
        int32_t *row = table + r * W;
        const int32_t *ids = self->held + r * self->stride;
        Py_ssize_t n = self->lens[r];
        int whole = mk[0] == WHOLE;
        if (self->ring && !whole)
            for (int32_t i = 0; i < mk[1]; i++) /* a ring position is below the ring length */
                whole |= mk[2 + i] < 0 || mk[2 + i] >= n;
        if (whole) {
            if (self->ring && n > 0) {
                tile(row, ids, n, W);
            } else if (self->ring) {
                memset(row, 0, sizeof(int32_t) * (size_t)W);
            } else {
                Py_ssize_t k = n < 0 ? 0 : n;
                memcpy(row, ids, sizeof(int32_t) * (size_t)k);
                for (Py_ssize_t j = k; j < W; j++)
                    row[j] = self->pad;
            }
            cells += W;
        } else if (self->ring) {
            for (int32_t i = 0; i < mk[1]; i++) {
                Py_ssize_t p = mk[2 + i];
                int32_t v = ids[p];
                for (Py_ssize_t j = p; j < W; j += n)
                    row[j] = v;
                cells += (W - 1 - p) / n + 1;
            }
        } else {
            int32_t lo = 0, hi = 0;
            if (mk[0] == SPAN) {
                lo = mk[2];
                hi = mk[3];
            }
            Py_ssize_t k = mk[0] == SPAN ? hi - lo : mk[1];
            for (Py_ssize_t i = 0; i < k; i++) {
                Py_ssize_t p = mk[0] == SPAN ? lo + i : mk[2 + i];
                if (p < 0 || p >= W)
                    continue; /* never staged: marks are bounded by the width */
                row[p] = p < n ? ids[p] : self->pad;
                cells++;
            }
        }
        mk[0] = CLEAN;
        mk[1] = 0;
        (*count)++;
        if (written) {
            PyObject *x = PyLong_FromSsize_t(r);
            if (!x || PyList_Append(written, x) < 0)
                PyErr_Clear(); /* a lost row number in a diagnostic list; the buffers are right */
            Py_XDECREF(x);
        }
    }
    return cells;
}

/* Check every record of a plan (bounds of every field) before anything is written. */
static int check_plan(GroupKernel *self, const int32_t *rec, Py_ssize_t total)
{
    Py_ssize_t at = 0;
    while (at < total) {
        if (total - at < HEADER)
            goto bad;
        const int32_t *h = rec + at;
        int32_t r = h[0], n = h[1], mode = h[2] & ~CHECKED, count = h[3];
        if (r < 0 || r >= self->rows || n < 0 || n > self->stride || total - at - HEADER < n)
            goto bad;
        if (self->ring && n == 0)
            goto bad;
        if (mode == POSITIONS) {
            if (count < 1 || count > MAX_POSITIONS)
                goto bad;
            for (int32_t i = 0; i < count; i++)
                if (h[4 + i] < 0 || h[4 + i] >= (self->ring ? n : self->width))
                    goto bad;
        } else if (mode == SPAN) {
            if (self->ring || h[4] < 0 || h[4] >= h[5] || h[5] > self->width)
                goto bad;
        } else if (mode != WHOLE) {
            goto bad;
        }
        at += HEADER + n;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "plan is not one this kernel staged");
    return -1;
}

static PyObject *kernel_commit(GroupKernel *self, PyObject *args)
{
    PyObject *plan, *slot_obj, *table_obj, *counts_obj, *column_obj;
    int want_rows;
    if (!PyArg_ParseTuple(args, "OOOOOp:commit", &plan, &slot_obj, &table_obj, &counts_obj,
                          &column_obj, &want_rows))
        return NULL;
    long long slot, column;
    if (int_arg(slot_obj, "slot", 0, self->slots, &slot) < 0)
        return NULL;
    Py_buffer table, counts;
    if (get_table(table_obj, &table, self->rows, self->width, "table") < 0)
        return NULL;
    if (get_table(counts_obj, &counts, self->rows, -1, "counts") < 0) {
        PyBuffer_Release(&table);
        return NULL;
    }
    PyObject *result = NULL, *written = NULL;
    Py_ssize_t groups = counts.shape[1];
    if (int_arg(column_obj, "column", 0, groups, &column) < 0)
        goto done;
    if (!PyBytes_CheckExact(plan) || PyBytes_GET_SIZE(plan) % sizeof(int32_t)) {
        PyErr_SetString(PyExc_TypeError, "plan must be a plan this kernel staged");
        goto done;
    }
    const int32_t *rec = (const int32_t *)PyBytes_AS_STRING(plan);
    Py_ssize_t total = PyBytes_GET_SIZE(plan) / (Py_ssize_t)sizeof(int32_t);
    if (check_plan(self, rec, total) < 0)
        goto done;
    if (want_rows && !(written = PyList_New(0)))
        goto done;
    /* Nothing below fails: the plan becomes the latest ids, every slot marks its rows. */
    int32_t *cnt = (int32_t *)counts.buf;
    for (Py_ssize_t at = 0; at < total;) {
        const int32_t *h = rec + at;
        int32_t r = h[0], n = h[1];
        memcpy(self->held + (Py_ssize_t)r * self->stride, h + HEADER, sizeof(int32_t) * (size_t)n);
        self->lens[r] = n;
        self->checked[r] = (h[2] & CHECKED) != 0;
        cnt[(Py_ssize_t)r * groups + column] = n;
        int32_t change[MARK] = {h[2] & ~CHECKED, h[3], h[4], h[5], h[6], h[7]};
        for (Py_ssize_t s = 0; s < self->slots; s++)
            merge(self->marks + (s * self->rows + r) * MARK, change, self->ring);
        at += HEADER + n;
    }
    Py_ssize_t rows_written;
    long long cells = render(self, (Py_ssize_t)slot, (int32_t *)table.buf, &rows_written, written);
    result = Py_BuildValue("(nLO)", rows_written, cells, written ? written : Py_None);
done:
    Py_XDECREF(written);
    PyBuffer_Release(&table);
    PyBuffer_Release(&counts);
    return result;
}

static PyObject *kernel_invalidate(GroupKernel *self, PyObject *arg)
{
    long long slot;
    if (PyLong_CheckExact(arg) && exact_value(arg) == -1) {
        mark_all(self, -1);
        Py_RETURN_NONE;
    }
    if (int_arg(arg, "slot", 0, self->slots, &slot) < 0)
        return NULL;
    mark_all(self, (Py_ssize_t)slot);
    Py_RETURN_NONE;
}

static PyObject *kernel_reset(GroupKernel *self, PyObject *unused)
{
    for (Py_ssize_t r = 0; r < self->rows; r++)
        self->lens[r] = -1;
    mark_all(self, -1);
    Py_RETURN_NONE;
}

static PyMethodDef kernel_methods[] = {
    {"held", (PyCFunction)kernel_held, METH_O, "A copy of the ids a row holds (None: unknown)."},
    {"length", (PyCFunction)kernel_length, METH_O, "How many ids a row holds (-1: unknown)."},
    {"stage", (PyCFunction)kernel_stage, METH_VARARGS,
     "stage(rows, lists, srcs, convert) -> (plan, None) or (None, (code, row, value))"},
    {"stage_ops", (PyCFunction)kernel_stage_ops, METH_VARARGS,
     "stage_ops(rows, items, srcs, convert) -> (plan, None) or (None, (code, row, value))"},
    {"commit", (PyCFunction)kernel_commit, METH_VARARGS,
     "commit(plan, slot, table, counts, column, want_rows) -> (rows, cells, rows list or None)"},
    {"invalidate", (PyCFunction)kernel_invalidate, METH_O,
     "Mark every row of a slot (-1: every slot) whole."},
    {"reset", (PyCFunction)kernel_reset, METH_NOARGS, "Forget every row's ids."},
    {NULL, NULL, 0, NULL},
};

static PyObject *get_ring(GroupKernel *self, void *c) { return PyBool_FromLong(self->ring); }
static PyObject *get_width(GroupKernel *self, void *c) { return PyLong_FromSsize_t(self->width); }
static PyObject *get_limit(GroupKernel *self, void *c) { return PyLong_FromLongLong(self->limit); }
static PyObject *get_shortest(GroupKernel *self, void *c)
{
    return PyLong_FromSsize_t(self->shortest);
}
static PyObject *get_pad(GroupKernel *self, void *c) { return PyLong_FromLong(self->pad); }
static PyObject *get_rows(GroupKernel *self, void *c) { return PyLong_FromSsize_t(self->rows); }
static PyObject *get_slots(GroupKernel *self, void *c) { return PyLong_FromSsize_t(self->slots); }

static PyGetSetDef kernel_getset[] = {
    {"ring", (getter)get_ring, NULL, NULL, NULL},
    {"width", (getter)get_width, NULL, NULL, NULL},
    {"limit", (getter)get_limit, NULL, NULL, NULL},
    {"shortest", (getter)get_shortest, NULL, NULL, NULL},
    {"pad", (getter)get_pad, NULL, NULL, NULL},
    {"rows", (getter)get_rows, NULL, NULL, NULL},
    {"slots", (getter)get_slots, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GroupKernelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "blockprep.engine._kernel.GroupKernel",
    .tp_basicsize = sizeof(GroupKernel),
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One group's held ids and per-slot marks (see blockprep/engine/twin.py).",
    .tp_methods = kernel_methods,
    .tp_getset = kernel_getset,
    .tp_init = (initproc)kernel_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_kernel",
    .m_doc = "The table kernel in C (see blockprep/engine/twin.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__kernel(void)
{
    if (PyType_Ready(&GroupKernelType) < 0)
        return NULL;
    static const char *tags[4] = {"w", "a", "s", "t"};
    for (int t = 0; t < 4; t++)
        if (!TAGS[t] && !(TAGS[t] = PyUnicode_InternFromString(tags[t])))
            return NULL;
    PyObject *m = PyModule_Create(&kernel_module);
    if (!m)
        return NULL;
    Py_INCREF(&GroupKernelType);
    if (PyModule_AddObject(m, "GroupKernel", (PyObject *)&GroupKernelType) < 0) {
        Py_DECREF(&GroupKernelType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
