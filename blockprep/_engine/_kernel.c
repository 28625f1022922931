/*
 * blockprep._engine._kernel: the table kernel in C (CPython C API and the buffer protocol only).
 *
 * The specification is blockprep/_engine/twin.py: the same class, the same methods, the same
 * results (buffers, held ids, counters, faults), errors included. Read its module docstring for
 * the rules; this file only says where the C differs in how, never in what.
 *
 * State of one GroupKernel (one cache group):
 *   held  [rows * stride] int32  the ids each row holds as of the latest commit (stride: the
 *                                longest row so far, at most width, so the state stays compact)
 *   lens  [rows]         int32   how many (-1: unknown)
 *   marks [slots * rows * MARK]  per slot and row: mode, count, p0..p3 (SPAN: p0 = lo, p1 = hi)
 *   dirty [slots * words]        per slot, a bit per row whose mark is not CLEAN (marks.c)
 * A plan is a bytes object of int32 records: row, n, mode, count, p0..p3, then the n new ids.
 * commit() validates every record and both buffers before its first write, so a plan that is
 * not one this kernel staged is a ValueError, never an out-of-bounds write.
 */
#include "kernel.h"

/* An exact int argument in [lo, hi) as a Py_ssize_t; -1 with an exception otherwise. */
int bk_int_arg(PyObject *x, const char *name, long long lo, long long hi, long long *out)
{
    if (!PyLong_CheckExact(x)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %s", name, bk_type_name(x));
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

/* The name of x's type as Python's type(x).__name__ says it (tp_name without its module). */
const char *bk_type_name(PyObject *x)
{
    const char *name = Py_TYPE(x)->tp_name, *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* RuntimeError when a callback of this kernel's own stage calls back into it. */
int bk_busy(GroupKernel *self)
{
    if (!self->busy)
        return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    "GroupKernel called again from a callback of its own stage");
    return -1;
}

/* A writable C-contiguous 2-D int32 buffer with rows rows (and width columns unless width < 0). */
static int get_table(PyObject *obj, Py_buffer *view, Py_ssize_t rows, Py_ssize_t width,
                     const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) < 0) { /* strides, format; read-only ok */
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
    if (width < 0 && view->shape[0] != rows) { /* the twin's words */
        PyErr_Format(PyExc_ValueError, "%s must have %zd rows, got %zd", name, rows,
                     view->shape[0]);
        PyBuffer_Release(view);
        return -1;
    }
    if (width >= 0 && (view->shape[0] != rows || view->shape[1] != width)) {
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

/* commit's and bind's table and counts (get_table each), which must not overlap: 0, or -1 with
 * the error and neither view held. */
static int get_tables(GroupKernel *self, PyObject *table_obj, PyObject *counts_obj,
                      Py_buffer *table, Py_buffer *counts)
{
    if (get_table(table_obj, table, self->rows, self->width, "table") < 0)
        return -1;
    if (get_table(counts_obj, counts, self->rows, -1, "counts") < 0) {
        PyBuffer_Release(table);
        return -1;
    }
    const char *t = table->buf, *c = counts->buf; /* both C-contiguous: [buf, buf + len) */
    if (t < c + counts->len && c < t + table->len && table->len && counts->len) {
        PyBuffer_Release(table);
        PyBuffer_Release(counts);
        PyErr_SetString(PyExc_ValueError, "table and counts must not overlap");
        return -1;
    }
    return 0;
}

PyObject *bk_fault(int code, Py_ssize_t row, PyObject *value)
{
    /* (None, (code, row, value)); steals nothing: value is borrowed. */
    return Py_BuildValue("(O(inO))", Py_None, code, row, value);
}

/* ---- the type -------------------------------------------------------------------------------- */

/* Drop the buffers bind() holds. */
static void unbind(GroupKernel *self)
{
    if (self->bound_table.obj) {
        PyBuffer_Release(&self->bound_table);
        PyBuffer_Release(&self->bound_counts);
    }
}

static void kernel_dealloc(GroupKernel *self)
{
    unbind(self);
    bk_scratch_free(&self->scratch);
    PyMem_Free(self->held);
    PyMem_Free(self->lens);
    PyMem_Free(self->checked);
    PyMem_Free(self->marks);
    PyMem_Free(self->dirty);
    PyMem_Free(self->stamps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int kernel_init(GroupKernel *self, PyObject *args, PyObject *kwds)
{
    if (bk_busy(self))
        return -1;
    static char *names[] = {"ring", "width", "limit", "shortest", "pad", "rows", "slots",
                            "distinct", NULL};
    PyObject *ring, *o[6];
    int distinct = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOO|$p", names, &ring, &o[0], &o[1], &o[2],
                                     &o[3], &o[4], &o[5], &distinct))
        return -1;
    static const char *fields[] = {"width", "limit", "shortest", "pad", "rows", "slots"};
    long long v[6];
    for (int i = 0; i < 6; i++) {
        if (!PyLong_CheckExact(o[i])) {
            PyErr_Format(PyExc_TypeError, "%s must be an int, got %s", fields[i],
                         bk_type_name(o[i]));
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
    if (rows < 0 || rows > INT32_MAX || slots <= 0 || slots > MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError,
                     "rows must be in [0, 2**31) and slots in [1, 2**16], got %R, %R", o[4], o[5]);
        return -1;
    }
    int truth = PyObject_IsTrue(ring);
    if (truth < 0)
        return -1;
    /* Sizes checked against overflow before allocating: rows * width int32 cells. */
    if ((size_t)rows > PY_SSIZE_T_MAX / sizeof(int32_t) / (size_t)width) {
        PyErr_SetString(PyExc_MemoryError, "table too large");
        return -1;
    }
    /* Everything new is allocated before anything old is freed: a failure keeps the kernel. */
    Py_ssize_t stride = width < 128 ? (Py_ssize_t)width : 128;
    int32_t *held = PyMem_Malloc(sizeof(int32_t) * (size_t)(rows * stride + 1));
    int32_t *lens = PyMem_Malloc(sizeof(int32_t) * (size_t)(rows + 1));
    uint8_t *checked = PyMem_Calloc((size_t)rows + 1, 1);
    int32_t *marks = PyMem_Malloc(sizeof(int32_t) * (size_t)(slots * rows * MARK + 1));
    uint64_t *dirty = PyMem_Calloc((size_t)(slots * BK_WORDS(rows) + 1), sizeof(uint64_t));
    uint32_t *stamps = limit <= STAMP_LIMIT ? PyMem_Calloc((size_t)limit, sizeof(uint32_t)) : NULL;
    if (!held || !lens || !checked || !marks || !dirty || (limit <= STAMP_LIMIT && !stamps)) {
        PyMem_Free(held);
        PyMem_Free(lens);
        PyMem_Free(checked);
        PyMem_Free(marks);
        PyMem_Free(dirty);
        PyMem_Free(stamps);
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->held);
    PyMem_Free(self->lens);
    PyMem_Free(self->checked);
    PyMem_Free(self->marks);
    PyMem_Free(self->dirty);
    PyMem_Free(self->stamps);
    unbind(self); /* bound to the old shape */
    self->held = held;
    self->lens = lens;
    self->checked = checked;
    self->marks = marks;
    self->dirty = dirty;
    self->stamps = stamps;
    self->generation = 0;
    self->stride = stride;
    self->ring = truth;
    self->distinct = distinct;
    self->width = (Py_ssize_t)width;
    self->limit = limit;
    self->shortest = (Py_ssize_t)shortest;
    self->pad = (int32_t)pad;
    self->rows = (Py_ssize_t)rows;
    self->slots = (Py_ssize_t)slots;
    for (Py_ssize_t r = 0; r < self->rows; r++)
        self->lens[r] = -1;
    bk_mark_all(self, -1);
    return 0;
}

/* Room for rows of n ids in held (n <= width): a wider stride, rows copied. Changes no value. */
int bk_grow_held(GroupKernel *self, Py_ssize_t n)
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
    if (bk_int_arg(arg, "row", 0, self->rows, &r) < 0)
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
    if (bk_int_arg(arg, "row", 0, self->rows, &r) < 0)
        return NULL;
    return PyLong_FromLong(self->lens[r]);
}

/* ---- commit ---------------------------------------------------------------------------------- */

/* Row r of the table: dst[j] = ids[j % n] by a doubling copy (the filled prefix, a multiple of
 * n long, copied onwards). */
/* dst[0..n) = value: memset when every byte of value is the same (0 and -1, the pads upstream
 * uses), else value doubled by memcpy as tile does (a plain loop is not vectorized at -O2: two
 * instructions a cell, 5% of a cold DeepSeek step). */
static void fill(int32_t *dst, Py_ssize_t n, int32_t value)
{
    if (n <= 0)
        return;
    if (value == 0 || value == -1) {
        memset(dst, value & 0xFF, sizeof(int32_t) * (size_t)n);
        return;
    }
    dst[0] = value;
    for (Py_ssize_t filled = 1; filled < n; filled *= 2) {
        Py_ssize_t c = filled < n - filled ? filled : n - filled;
        memcpy(dst + filled, dst, sizeof(int32_t) * (size_t)c);
    }
}

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

/* Render row r's mark in slot into table (row r's bit cleared, its mark CLEAN); the cells written,
 * -1 when the row was not marked. Inline in render's loop (a call a row cost a by-value DeepSeek
 * step 0.5% more instructions); bk_render_row below for apply_row.c. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline long long render_row(GroupKernel *self, Py_ssize_t slot, int32_t *table,
                                   Py_ssize_t r)
{
    const Py_ssize_t W = self->width;
    int32_t *mk = self->marks + (slot * self->rows + r) * MARK;
    self->dirty[slot * BK_WORDS(self->rows) + r / 64] &= ~((uint64_t)1 << (r % 64));
    if (mk[0] == CLEAN)
        return -1;
    long long cells = 0;
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
        } else if (self->ring && n < 0) { /* unknown */
            memset(row, 0, sizeof(int32_t) * (size_t)W);
        } else if (self->ring) { /* cleared */
            fill(row, W, self->pad);
        } else {
            Py_ssize_t k = n < 0 ? 0 : n;
            memcpy(row, ids, sizeof(int32_t) * (size_t)k);
            fill(row + k, W - k, self->pad);
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
    return cells;
}

long long bk_render_row(GroupKernel *self, Py_ssize_t slot, int32_t *table, Py_ssize_t r)
{
    return render_row(self, slot, table, r);
}

/* Render slot's marked rows into table; returns the cells written, appends rows to `written`. */
static long long render(GroupKernel *self, Py_ssize_t slot, int32_t *table, Py_ssize_t *count,
                        PyObject *written)
{
    long long cells = 0;
    *count = 0;
    const uint64_t *dirty = self->dirty + slot * BK_WORDS(self->rows);
    for (Py_ssize_t w = 0; w < BK_WORDS(self->rows); w++) /* the marked rows, in row order */
    for (uint64_t bits = dirty[w]; bits; bits &= bits - 1) {
        Py_ssize_t r = w * 64 + __builtin_ctzll(bits);
        long long row_cells = render_row(self, slot, table, r); /* clears r's bit */
        if (row_cells < 0)
            continue;
        cells += row_cells;
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

/* The records of plan, a plan this kernel staged (bytes of int32 records), every field checked
 * in bounds before anything is written; their count of words in *total. NULL with TypeError
 * (not such bytes) or ValueError (a record out of bounds). */
static const int32_t *checked_plan(GroupKernel *self, PyObject *plan, Py_ssize_t *total_out)
{
    if (!PyBytes_CheckExact(plan) || PyBytes_GET_SIZE(plan) % sizeof(int32_t)) {
        PyErr_SetString(PyExc_TypeError, "plan must be a plan this kernel staged");
        return NULL;
    }
    const int32_t *rec = (const int32_t *)PyBytes_AS_STRING(plan);
    const Py_ssize_t total = PyBytes_GET_SIZE(plan) / (Py_ssize_t)sizeof(int32_t);
    *total_out = total;
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
    return rec;
bad:
    PyErr_SetString(PyExc_ValueError, "plan is not one this kernel staged");
    return NULL;
}

/* commit's (rows written, cells written, the rows or None); NULL with an exception. */
static PyObject *commit_result(Py_ssize_t rows_written, long long cells, PyObject *written)
{
    PyObject *result = PyTuple_New(3), *a = PyLong_FromSsize_t(rows_written),
             *b = PyLong_FromLongLong(cells);
    if (!result || !a || !b) {
        Py_XDECREF(result);
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    PyObject *c = written ? written : Py_None;
    Py_INCREF(c);
    PyTuple_SET_ITEM(result, 0, a);
    PyTuple_SET_ITEM(result, 1, b);
    PyTuple_SET_ITEM(result, 2, c);
    return result;
}

/* commit(plan, slot, table, counts, column, want_rows). Vectorcall, its result built by hand:
 * PyArg_ParseTuple and Py_BuildValue cost about 1,100 instructions a call (7 a DeepSeek step). */
static PyObject *kernel_commit(GroupKernel *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "commit() takes exactly 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *plan = args[0], *slot_obj = args[1], *table_obj = args[2], *counts_obj = args[3],
             *column_obj = args[4];
    int want_rows = PyObject_IsTrue(args[5]);
    if (want_rows < 0)
        return NULL;
    long long slot, column;
    if (bk_busy(self) || bk_int_arg(slot_obj, "slot", 0, self->slots, &slot) < 0)
        return NULL;
    Py_buffer table, counts;
    if (get_tables(self, table_obj, counts_obj, &table, &counts) < 0)
        return NULL;
    PyObject *result = NULL, *written = NULL;
    Py_ssize_t groups = counts.shape[1];
    if (bk_int_arg(column_obj, "column", 0, groups, &column) < 0)
        goto done;
    Py_ssize_t total;
    const int32_t *rec = checked_plan(self, plan, &total);
    if (!rec)
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
        bk_mark_row(self, r, change);
        at += HEADER + n;
    }
    Py_ssize_t rows_written;
    long long cells = render(self, (Py_ssize_t)slot, (int32_t *)table.buf, &rows_written, written);
    result = commit_result(rows_written, cells, written);
done:
    Py_XDECREF(written);
    PyBuffer_Release(&table);
    PyBuffer_Release(&counts);
    return result;
}

/* bind(table, counts, column): the buffers apply_row renders into, as commit's for slot 0 (held
 * until the next bind, a re-init or the kernel's end; the exporters cannot resize meanwhile). */
static PyObject *kernel_bind(GroupKernel *self, PyObject *args)
{
    PyObject *table_obj, *counts_obj, *column_obj;
    if (!PyArg_ParseTuple(args, "OOO:bind", &table_obj, &counts_obj, &column_obj))
        return NULL;
    long long column;
    Py_buffer table, counts;
    if (bk_busy(self) || get_tables(self, table_obj, counts_obj, &table, &counts) < 0)
        return NULL;
    if (bk_int_arg(column_obj, "column", 0, counts.shape[1], &column) < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&counts);
        return NULL;
    }
    unbind(self);
    self->bound_table = table;
    self->bound_counts = counts;
    self->bound_column = (Py_ssize_t)column;
    Py_RETURN_NONE;
}

static PyObject *kernel_invalidate(GroupKernel *self, PyObject *arg)
{
    long long slot;
    if (bk_busy(self))
        return NULL;
    if (PyLong_CheckExact(arg) && exact_value(arg) == -1) {
        bk_mark_all(self, -1);
        Py_RETURN_NONE;
    }
    if (bk_int_arg(arg, "slot", 0, self->slots, &slot) < 0)
        return NULL;
    bk_mark_all(self, (Py_ssize_t)slot);
    Py_RETURN_NONE;
}

/* The rows a row argument names: [*first, *last) (-1: every row); -1 with an exception. */
static int row_targets(GroupKernel *self, PyObject *arg, Py_ssize_t *first, Py_ssize_t *last)
{
    long long r;
    if (bk_busy(self))
        return -1;
    if (PyLong_CheckExact(arg) && exact_value(arg) == -1) {
        *first = 0;
        *last = self->rows;
        return 0;
    }
    if (bk_int_arg(arg, "row", 0, self->rows, &r) < 0)
        return -1;
    *first = (Py_ssize_t)r;
    *last = (Py_ssize_t)r + 1;
    return 0;
}

static PyObject *kernel_clear(GroupKernel *self, PyObject *arg)
{
    Py_ssize_t first, last;
    if (row_targets(self, arg, &first, &last) < 0)
        return NULL;
    for (Py_ssize_t r = first; r < last; r++) {
        int32_t m = self->lens[r];
        if (m == 0)
            continue; /* holds none already */
        int32_t change[MARK] = {WHOLE, 0, 0, 0, 0, 0};
        if (m > 0 && !self->ring) { /* a paged row: its ids' cells, [0, m) */
            Py_ssize_t differ = 0;
            int32_t lo = -1, hi = -1;
            for (int32_t p = 0; p < m; p++)
                bk_note_differ(p, &differ, change, &lo, &hi);
            bk_close_mark(self, differ, lo, hi, change);
        }
        self->lens[r] = 0;
        self->checked[r] = 0;
        bk_mark_row(self, r, change);
    }
    Py_RETURN_NONE;
}

static PyObject *kernel_forget(GroupKernel *self, PyObject *arg)
{
    Py_ssize_t first, last;
    if (row_targets(self, arg, &first, &last) < 0)
        return NULL;
    for (Py_ssize_t r = first; r < last; r++) {
        self->lens[r] = -1;
        self->checked[r] = 0;
        bk_unmark_row(self, r);
    }
    Py_RETURN_NONE;
}

static PyObject *kernel_rows_of(GroupKernel *self, PyObject *plan)
{
    Py_ssize_t total;
    const int32_t *rec = checked_plan(self, plan, &total);
    if (!rec)
        return NULL;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t at = 0; out && at < total; at += HEADER + rec[at + 1]) {
        PyObject *x = PyLong_FromLong(rec[at]);
        if (!x || PyList_Append(out, x) < 0)
            Py_CLEAR(out);
        Py_XDECREF(x);
    }
    return out;
}

static PyMethodDef kernel_methods[] = {
    {"held", (PyCFunction)kernel_held, METH_O, "A copy of the ids a row holds (None: unknown)."},
    {"length", (PyCFunction)kernel_length, METH_O, "How many ids a row holds (-1: unknown)."},
    {"stage", (PyCFunction)(void (*)(void))bk_stage, METH_FASTCALL | METH_KEYWORDS,
     "stage(rows, items, srcs, convert, key=None, *, ops=False, data=None) -> (plan, None) or "
     "(None, (code, row, value))"},
    {"commit", (PyCFunction)(void (*)(void))kernel_commit, METH_FASTCALL,
     "commit(plan, slot, table, counts, column, want_rows) -> (rows, cells, rows list or None)"},
    {"bind", (PyCFunction)kernel_bind, METH_VARARGS,
     "bind(table, counts, column): apply_row's buffers (commit's, for slot 0)"},
    {"apply_row", (PyCFunction)(void (*)(void))bk_apply_row, METH_FASTCALL,
     "apply_row(kind, row, value) -> cells written, or None: not decided here"},
    {"apply_step", (PyCFunction)(void (*)(void))bk_apply_step, METH_FASTCALL,
     "apply_step(finished, appended, added, moves) -> (cells, hits, rows written) or None"},
    {"invalidate", (PyCFunction)kernel_invalidate, METH_O,
     "Mark every row of a slot (-1: every slot) whole."},
    {"clear", (PyCFunction)kernel_clear, METH_O,
     "A row (-1: every row) holds no ids; every slot marks what that changes."},
    {"forget", (PyCFunction)kernel_forget, METH_O,
     "A row (-1: every row) holds unknown ids; no slot marks it."},
    {"rows_of", (PyCFunction)kernel_rows_of, METH_O, "The rows a plan changes, in its order."},
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
static PyObject *get_distinct(GroupKernel *self, void *c)
{
    return PyBool_FromLong(self->distinct);
}
static PyObject *get_rows(GroupKernel *self, void *c) { return PyLong_FromSsize_t(self->rows); }
static PyObject *get_slots(GroupKernel *self, void *c) { return PyLong_FromSsize_t(self->slots); }

static PyGetSetDef kernel_getset[] = {
    {"ring", (getter)get_ring, NULL, NULL, NULL},
    {"width", (getter)get_width, NULL, NULL, NULL},
    {"limit", (getter)get_limit, NULL, NULL, NULL},
    {"shortest", (getter)get_shortest, NULL, NULL, NULL},
    {"pad", (getter)get_pad, NULL, NULL, NULL},
    {"distinct", (getter)get_distinct, NULL, NULL, NULL},
    {"rows", (getter)get_rows, NULL, NULL, NULL},
    {"slots", (getter)get_slots, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GroupKernelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "blockprep._engine._kernel.GroupKernel",
    .tp_basicsize = sizeof(GroupKernel),
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One group's held ids and per-slot marks (see blockprep/_engine/twin.py).",
    .tp_methods = kernel_methods,
    .tp_getset = kernel_getset,
    .tp_init = (initproc)kernel_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef module_methods[] = {
    {"index_records", (PyCFunction)bk_index_records, METH_VARARGS,
     "index_records(data, count, rows, groups) -> [{table row: (offset, ...)}] per group, or None"},
    {"step_slots", (PyCFunction)(void (*)(void))bk_step_slots, METH_FASTCALL,
     "step_slots(seq_lens, items, lengths, table, width, page_size, max_seq_len) -> slots or None"},
    {"paged_step", (PyCFunction)(void (*)(void))bk_paged_step, METH_FASTCALL,
     "paged_step(seq_lens, tokens, items, lengths, table, width, page_size, max_seq_len, "
     "token_out, seq_out, slot_out) -> bool: slots, tokens and lengths written, or nothing"},
    {"differing_rows", (PyCFunction)(void (*)(void))bk_differing_rows, METH_FASTCALL,
     "differing_rows(new, old) -> the rows r where new[r] != old[r], or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_kernel",
    .m_doc = "The table kernel in C (see blockprep/_engine/twin.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__kernel(void)
{
    if (PyType_Ready(&GroupKernelType) < 0)
        return NULL;
    if (bk_init_tags() < 0)
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
