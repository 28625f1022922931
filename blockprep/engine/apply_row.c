/*
 * apply_row.c: GroupKernel.apply_row (see blockprep/engine/twin.py for the contract): one row's
 * change, decided and committed in one call into the buffers bind() gave, as stage_ops of that
 * row then commit into slot 0 would, rendering only that row. A table's per-row calls (append,
 * a whole row, a copy, a clear) made that a stage, a plan's bytes, two buffer requests and four
 * Python frames each.
 *
 * It decides only plain cases and answers None for any other (a non-int id, an id out of range,
 * an unknown or too long row, a distinct kernel): the caller's general path then decides, and
 * words any error. None is answered before anything changes; past the decision nothing fails.
 */
#include "kernel.h"

enum { ROW_APPEND = 0, ROW_WHOLE = 1, ROW_COPY = 2, ROW_CLEAR = 3 };

/* Whether every item of lst (an exact list) is an exact int in [0, limit). Runs no Python. */
static int plain_ids(GroupKernel *self, PyObject *lst)
{
    PyObject *const *items = ((PyListObject *)lst)->ob_item;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lst); i++) {
        if (!PyLong_CheckExact(items[i]))
            return 0;
        long long v = exact_value(items[i]);
        if (v == BIG || v < 0 || v >= self->limit)
            return 0;
    }
    return 1;
}

/* The mark of a row that held old[0..om) (om >= 0) and will hold ids[0..n): as stage.c's; the
 * ids come from lst (an exact list of checked ints) when ids is NULL. 0: no position differs. */
static int row_change(GroupKernel *self, const int32_t *old, Py_ssize_t om, const int32_t *ids,
                      PyObject *lst, Py_ssize_t n, int32_t *change)
{
    Py_ssize_t shorter = n < om ? n : om, longer = n < om ? om : n, differ = 0;
    int32_t lo = -1, hi = -1;
    for (Py_ssize_t p = 0; p < longer; p++) {
        if (p < shorter) {
            int32_t v = ids ? ids[p] : (int32_t)exact_value(PyList_GET_ITEM(lst, p));
            if (v == old[p])
                continue;
        }
        if (differ < MAX_POSITIONS)
            change[2 + differ] = (int32_t)p;
        if (lo < 0)
            lo = (int32_t)p;
        hi = (int32_t)p + 1;
        differ++;
    }
    if (!differ)
        return 0;
    if (differ <= MAX_POSITIONS) {
        change[0] = POSITIONS;
        change[1] = (int32_t)differ;
    } else if (self->ring) {
        change[0] = WHOLE;
        change[1] = 0;
    } else {
        change[0] = SPAN;
        change[1] = 0;
        change[2] = lo;
        change[3] = hi;
    }
    return 1;
}

PyObject *bk_apply_row(GroupKernel *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "apply_row(kind, row, value) takes 3 arguments, got %zd",
                     nargs);
        return NULL;
    }
    if (bk_busy(self))
        return NULL;
    if (!self->bound_table.obj) {
        PyErr_SetString(PyExc_RuntimeError, "apply_row needs the buffers of bind() first");
        return NULL;
    }
    PyObject *value = args[2];
    long long kind = PyLong_CheckExact(args[0]) ? exact_value(args[0]) : -1;
    if (kind < ROW_APPEND || kind > ROW_CLEAR) {
        PyErr_Format(PyExc_ValueError, "kind must be 0, 1, 2 or 3, got %R", args[0]);
        return NULL;
    }
    long long r = PyLong_CheckExact(args[1]) ? exact_value(args[1]) : -1;
    if (r < 0 || r >= self->rows || self->distinct)
        Py_RETURN_NONE;
    const Py_ssize_t W = self->width, om = self->lens[r];
    int32_t change[MARK] = {WHOLE, 0, 0, 0, 0, 0};
    Py_ssize_t n = 0, at = 0;  /* the row will hold n ids; the new ones from position at */
    PyObject *lst = NULL;      /* ... from this list, or */
    long long src = -1;        /* ... from this row's held ids (a copy) */
    /* 1. Decide: nothing changes before the write below. */
    if (kind == ROW_CLEAR) {
        if (om == 0)
            return PyLong_FromLong(0); /* holds none already */
        if (om > 0 && !self->ring) { /* a paged row: its ids' cells, as kernel_clear marks */
            if (om <= MAX_POSITIONS) {
                change[0] = POSITIONS;
                change[1] = (int32_t)om;
                for (int32_t i = 0; i < om; i++)
                    change[2 + i] = i;
            } else {
                change[0] = SPAN;
                change[3] = (int32_t)om;
            }
        }
    } else if (kind == ROW_COPY) {
        src = PyLong_CheckExact(value) ? exact_value(value) : -1;
        if (src < 0 || src >= self->rows || src == r || self->lens[src] <= 0)
            Py_RETURN_NONE;
        n = self->lens[src];
    } else {
        if (!PyList_CheckExact(value) || !plain_ids(self, value))
            Py_RETURN_NONE;
        lst = value;
        if (kind == ROW_APPEND) {
            if (om < 0)
                Py_RETURN_NONE; /* unknown ids: nothing to append to */
            at = om;
        }
        n = at + PyList_GET_SIZE(lst);
        if (kind == ROW_APPEND && n == om)
            return PyLong_FromLong(0); /* appends nothing */
    }
    if (kind != ROW_CLEAR) {
        if (n > W || n < self->shortest)
            Py_RETURN_NONE;
        if (om >= 0 && !(self->ring && om != n)) {
            const int32_t *old = self->held + r * self->stride;
            /* an append keeps the held ids (positions past them all differ) */
            const int32_t *ids = kind == ROW_APPEND ? old
                                 : src >= 0         ? self->held + src * self->stride
                                                    : NULL;
            if (!row_change(self, old, om, ids, lst, n, change))
                return PyLong_FromLong(0); /* holds exactly what it held */
        }
        if (bk_grow_held(self, n) < 0) /* changes no value; before any pointer into held */
            return NULL;
    }
    /* 2. Write: nothing below fails. */
    int32_t *held = self->held + r * self->stride;
    if (src >= 0)
        memcpy(held, self->held + src * self->stride, sizeof(int32_t) * (size_t)n);
    for (Py_ssize_t p = at; lst && p < n; p++)
        held[p] = (int32_t)exact_value(PyList_GET_ITEM(lst, p - at));
    self->lens[r] = (int32_t)n;
    self->checked[r] = 0;
    int32_t *counts = (int32_t *)self->bound_counts.buf;
    counts[r * self->bound_counts.shape[1] + self->bound_column] = (int32_t)n;
    bk_mark_row(self, (Py_ssize_t)r, change);
    long long cells = bk_render_row(self, 0, (int32_t *)self->bound_table.buf, (Py_ssize_t)r);
    return PyLong_FromLongLong(cells);
}
