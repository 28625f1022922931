/*
 * apply_row.c: GroupKernel.apply_row (see blockprep/_engine/twin.py for the contract): one row's
 * change, decided and committed in one call into the buffers bind() gave, as stage (ops items) of
 * that row then commit into slot 0 would, rendering only that row. A table's per-row calls (append,
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

/* Position p of a row whose ids are base[0..at) then the items of lst (checked ints). */
static inline int32_t id_at(const int32_t *base, Py_ssize_t at, PyObject *lst, Py_ssize_t p)
{
    return p < at ? base[p] : (int32_t)exact_value(PyList_GET_ITEM(lst, p - at));
}

/* The mark of a row that held old[0..om) (om >= 0; a ring row of the same length) and will hold
 * n ids, base[0..at) then lst's items (bk_close_mark's rule, as stage.c's). 0 when no position
 * differs. */
static int row_change(GroupKernel *self, const int32_t *old, Py_ssize_t om, const int32_t *base,
                      Py_ssize_t at, PyObject *lst, Py_ssize_t n, int32_t *change)
{
    Py_ssize_t shorter = n < om ? n : om, longer = n < om ? om : n, differ = 0;
    int32_t lo = -1, hi = -1;
    for (Py_ssize_t p = 0; p < longer; p++)
        if (p >= shorter || id_at(base, at, lst, p) != old[p])
            bk_note_differ((int32_t)p, &differ, change, &lo, &hi);
    return bk_close_mark(self, differ, lo, hi, change);
}

/* The mark of row r becoming n ids as above (WHOLE when its ids are unknown or a ring row's
 * length changes); 0 when it holds exactly those ids. */
static int new_mark(GroupKernel *self, Py_ssize_t r, const int32_t *base, Py_ssize_t at,
                    PyObject *lst, Py_ssize_t n, int32_t *change)
{
    const Py_ssize_t om = self->lens[r];
    change[0] = WHOLE;
    change[1] = 0;
    if (om < 0 || (self->ring && om != n))
        return 1;
    return row_change(self, self->held + r * self->stride, om, base, at, lst, n, change);
}

/* Row r holds n ids, base[0..at) then lst's items (room for n made in held; base may be the
 * row's own held ids, or another row's): held ids, length, count, every slot's mark, then slot
 * 0's render of the row. Never fails; the cells written. */
static long long commit_row(GroupKernel *self, Py_ssize_t r, const int32_t *base, Py_ssize_t at,
                            PyObject *lst, Py_ssize_t n, const int32_t *change)
{
    int32_t *held = self->held + r * self->stride;
    if (at && base != held)
        memmove(held, base, sizeof(int32_t) * (size_t)at);
    for (Py_ssize_t p = at; p < n; p++)
        held[p] = (int32_t)exact_value(PyList_GET_ITEM(lst, p - at));
    self->lens[r] = (int32_t)n;
    self->checked[r] = 0;
    int32_t *counts = (int32_t *)self->bound_counts.buf;
    counts[r * self->bound_counts.shape[1] + self->bound_column] = (int32_t)n;
    bk_mark_row(self, r, change);
    return bk_render_row(self, 0, (int32_t *)self->bound_table.buf, r);
}

/* The checks every entry point makes first: nargs, not busy, bound. */
static int ready(GroupKernel *self, Py_ssize_t nargs, Py_ssize_t want, const char *name)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, want, nargs);
        return -1;
    }
    if (bk_busy(self))
        return -1;
    if (!self->bound_table.obj) {
        PyErr_Format(PyExc_RuntimeError, "%s needs the buffers of bind() first", name);
        return -1;
    }
    return 0;
}

/* A row argument: an exact int in [0, rows), else -1. */
static inline Py_ssize_t row_arg(GroupKernel *self, PyObject *o)
{
    long long r = PyLong_CheckExact(o) ? exact_value(o) : -1;
    return r >= 0 && r < self->rows ? (Py_ssize_t)r : -1;
}

PyObject *bk_apply_row(GroupKernel *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (ready(self, nargs, 3, "apply_row") < 0)
        return NULL;
    PyObject *value = args[2];
    long long kind = PyLong_CheckExact(args[0]) ? exact_value(args[0]) : -1;
    if (kind < ROW_APPEND || kind > ROW_CLEAR) {
        PyErr_Format(PyExc_ValueError, "kind must be 0, 1, 2 or 3, got %R", args[0]);
        return NULL;
    }
    const Py_ssize_t r = row_arg(self, args[1]);
    if (r < 0 || self->distinct)
        Py_RETURN_NONE;
    const Py_ssize_t om = self->lens[r];
    int32_t change[MARK] = {WHOLE, 0, 0, 0, 0, 0};
    Py_ssize_t n = 0, at = 0;      /* the row will hold n ids: base[0..at), then lst's */
    const int32_t *base = NULL;
    PyObject *lst = NULL;
    /* 1. Decide: nothing changes before the write below. */
    if (kind == ROW_CLEAR) {
        if (om == 0)
            return PyLong_FromLong(0); /* holds none already */
        if (om > 0 && !self->ring) /* a paged row: its ids' cells, as kernel_clear marks */
            row_change(self, self->held + r * self->stride, om, NULL, 0, NULL, 0, change);
    } else {
        if (kind == ROW_COPY) {
            Py_ssize_t src = row_arg(self, value);
            if (src < 0 || src == r || self->lens[src] <= 0)
                Py_RETURN_NONE;
            n = at = self->lens[src];
        } else {
            if (!PyList_CheckExact(value) || !plain_ids(self, value))
                Py_RETURN_NONE;
            lst = value;
            if (kind == ROW_APPEND && om < 0)
                Py_RETURN_NONE; /* unknown ids: nothing to append to */
            at = kind == ROW_APPEND ? om : 0;
            n = at + PyList_GET_SIZE(lst);
            if (kind == ROW_APPEND && n == om)
                return PyLong_FromLong(0); /* appends nothing */
        }
        if (n > self->width || n < self->shortest)
            Py_RETURN_NONE;
        if (bk_grow_held(self, n) < 0) /* changes no value; before any pointer into held */
            return NULL;
        base = kind == ROW_COPY ? self->held + row_arg(self, value) * self->stride
                                : self->held + r * self->stride;
        if (!new_mark(self, r, base, at, lst, n, change))
            return PyLong_FromLong(0); /* holds exactly what it held */
    }
    /* 2. Write: nothing below fails. */
    return PyLong_FromLongLong(commit_row(self, r, base, at, lst, n, change));
}

/* ---- apply_step: a vLLM-like scheduler step of row changes, all or nothing ------------------ */

enum { S_TRUNC = 1, S_APP = 2, S_ADDED = 4, S_SEEN = 8, S_SIM = 16 };

/* A walk over (row, value) pairs: an exact dict, or an exact list or tuple of exact 2-tuples or
 * 2-lists. Reading them runs no Python code, so the borrowed items stay valid for the call. */
typedef struct {
    PyObject *obj;
    Py_ssize_t at;
} Pairs;

static int pairs_start(Pairs *w, PyObject *obj)
{
    w->obj = obj;
    w->at = 0;
    return PyDict_CheckExact(obj) || PyList_CheckExact(obj) || PyTuple_CheckExact(obj);
}

/* The next pair (borrowed): 1, 0 at the end, -1 for an item that is no pair. */
static int pairs_next(Pairs *w, PyObject **key, PyObject **value)
{
    if (PyDict_CheckExact(w->obj))
        return PyDict_Next(w->obj, &w->at, key, value);
    if (w->at >= PySequence_Fast_GET_SIZE(w->obj))
        return 0;
    PyObject *item = PySequence_Fast_GET_ITEM(w->obj, w->at++);
    if (!(PyTuple_CheckExact(item) || PyList_CheckExact(item)) ||
        PySequence_Fast_GET_SIZE(item) != 2)
        return -1;
    *key = PySequence_Fast_GET_ITEM(item, 0);
    *value = PySequence_Fast_GET_ITEM(item, 1);
    return 1;
}

/* Phase 1 of apply_step: every check, on a simulation of the rows' lengths (flags, sim); the
 * rows the deltas touch in touched (*nt), the longest row in *most. 0 when the whole step is a
 * plain case, 1 otherwise. Changes nothing. */
static int decide_step(GroupKernel *self, PyObject *const *args, uint8_t *flags, int32_t *sim,
                       PyObject **lists, int32_t *touched, Py_ssize_t *nt, Py_ssize_t *most)
{
    PyObject *finished = args[0], *moves = args[3], *k, *v;
    Pairs appended, added;
    if (!(PyList_CheckExact(finished) || PyTuple_CheckExact(finished)) ||
        !(PyList_CheckExact(moves) || PyTuple_CheckExact(moves)) ||
        !pairs_start(&appended, args[1]) || !pairs_start(&added, args[2]))
        return 1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(finished); i++) {
        Py_ssize_t r = row_arg(self, PySequence_Fast_GET_ITEM(finished, i));
        if (r < 0 || self->lens[r] < 0)
            return 1;
        if (!(flags[r] & S_SIM))
            touched[(*nt)++] = (int32_t)r;
        flags[r] |= S_TRUNC | S_SIM;
        sim[r] = 0;
    }
    int status;
    while ((status = pairs_next(&appended, &k, &v)) > 0) { /* after a truncation: its ids */
        Py_ssize_t r = row_arg(self, k);
        if (r < 0 || (flags[r] & S_SEEN))
            return 1;
        flags[r] |= S_SEEN;
        if (v == Py_None)
            continue; /* nothing appended (vLLM's new_block_ids may be None) */
        if (!PyList_CheckExact(v) || !plain_ids(self, v) || self->lens[r] < 0)
            return 1;
        if (!(flags[r] & S_SIM))
            touched[(*nt)++] = (int32_t)r;
        sim[r] = (int32_t)((flags[r] & S_TRUNC ? 0 : self->lens[r]) + PyList_GET_SIZE(v));
        flags[r] |= S_APP | S_SIM;
        lists[r] = v;
    }
    if (status < 0)
        return 1;
    while ((status = pairs_next(&added, &k, &v)) > 0) { /* the row holds these ids */
        Py_ssize_t r = row_arg(self, k);
        if (r < 0 || (flags[r] & (S_SEEN | S_ADDED)) || self->lens[r] < 0 ||
            !PyList_CheckExact(v) || !plain_ids(self, v))
            return 1;
        if (!(flags[r] & S_SIM))
            touched[(*nt)++] = (int32_t)r;
        sim[r] = (int32_t)PyList_GET_SIZE(v);
        flags[r] |= S_ADDED | S_TRUNC | S_SIM;
        lists[r] = v;
    }
    if (status < 0)
        return 1;
    for (Py_ssize_t i = 0; i < *nt; i++) {
        Py_ssize_t n = sim[touched[i]];
        if (n > self->width || n < self->shortest)
            return 1;
        *most = n > *most ? n : *most;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(moves); i++) { /* in order */
        PyObject *pair = PySequence_Fast_GET_ITEM(moves, i);
        if (!(PyTuple_CheckExact(pair) || PyList_CheckExact(pair)) ||
            PySequence_Fast_GET_SIZE(pair) != 2)
            return 1;
        Py_ssize_t src = row_arg(self, PySequence_Fast_GET_ITEM(pair, 0));
        Py_ssize_t tgt = row_arg(self, PySequence_Fast_GET_ITEM(pair, 1));
        if (src < 0 || tgt < 0 || src == tgt)
            return 1;
        Py_ssize_t n = flags[src] & S_SIM ? sim[src] : self->lens[src];
        if (n <= 0 || n < self->shortest)
            return 1; /* a copy of no ids or of unknown ones */
        sim[tgt] = (int32_t)n;
        flags[tgt] |= S_SIM;
    }
    return 0;
}

PyObject *bk_apply_step(GroupKernel *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (ready(self, nargs, 4, "apply_step") < 0)
        return NULL;
    if (self->distinct)
        Py_RETURN_NONE;
    int empty = 1; /* the common step of a small batch: nothing at all */
    for (int i = 0; i < 4 && empty; i++)
        empty = PyDict_CheckExact(args[i])
                    ? PyDict_GET_SIZE(args[i]) == 0
                    : (PyList_CheckExact(args[i]) || PyTuple_CheckExact(args[i])) &&
                          PySequence_Fast_GET_SIZE(args[i]) == 0;
    if (empty)
        return Py_BuildValue("(iiN)", 0, 0, PyList_New(0));
    /* Per-row scratch: on the stack for tables of up to STACK_ROWS rows (a vLLM batch), else
     * allocated (a step's cost is then the allocations' too). */
    enum { STACK_ROWS = 256 };
    uint8_t flags_s[STACK_ROWS];
    int32_t sim_s[STACK_ROWS], touched_s[STACK_ROWS], wrote_s[2 * STACK_ROWS];
    PyObject *lists_s[STACK_ROWS];
    const Py_ssize_t R = self->rows;
    const int small = R <= STACK_ROWS;
    uint8_t *flags = small ? flags_s : PyMem_Malloc((size_t)R + 1);
    int32_t *sim = small ? sim_s : PyMem_Malloc(sizeof(int32_t) * ((size_t)R + 1));
    int32_t *touched = small ? touched_s : PyMem_Malloc(sizeof(int32_t) * ((size_t)R + 1));
    PyObject **lists = small ? lists_s : PyMem_Malloc(sizeof(PyObject *) * ((size_t)R + 1));
    PyObject *result = NULL, *rows = NULL;
    int32_t *wrote = NULL;
    Py_ssize_t nt = 0, most = 0;
    if (!flags || !sim || !touched || !lists) {
        PyErr_NoMemory();
        goto done;
    }
    memset(flags, 0, (size_t)R);
    if (decide_step(self, args, flags, sim, lists, touched, &nt, &most)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *moves = args[3];
    const Py_ssize_t nm = PySequence_Fast_GET_SIZE(moves);
    wrote = nt + nm <= 2 * STACK_ROWS ? wrote_s : PyMem_Malloc(sizeof(int32_t) * ((size_t)(nt + nm) + 1));
    if (!wrote) {
        PyErr_NoMemory();
        goto done;
    }
    if (bk_grow_held(self, most) < 0) /* changes no value; before any pointer into held */
        goto done;
    /* 2. Write, as stage (ops items) of the touched rows, one commit, then each move's copy:
     * nothing below fails but the result's allocation (the buffers are then right, as commit's). */
    long long cells = 0;
    Py_ssize_t hits = 0, k = 0;
    for (Py_ssize_t i = 0; i < nt + nm; i++) { /* the touched rows, then each move in order */
        Py_ssize_t r, at, n;
        const int32_t *base;
        PyObject *lst = NULL;
        if (i < nt) {
            r = touched[i];
            at = flags[r] & S_TRUNC ? 0 : self->lens[r];
            lst = flags[r] & (S_APP | S_ADDED) ? lists[r] : NULL;
            n = at + (lst ? PyList_GET_SIZE(lst) : 0);
            base = self->held + r * self->stride;
        } else { /* a copy of what the source holds now */
            PyObject *pair = PySequence_Fast_GET_ITEM(moves, i - nt);
            const Py_ssize_t src = row_arg(self, PySequence_Fast_GET_ITEM(pair, 0));
            r = row_arg(self, PySequence_Fast_GET_ITEM(pair, 1));
            at = n = self->lens[src];
            base = self->held + src * self->stride;
        }
        int32_t change[MARK] = {WHOLE, 0, 0, 0, 0, 0};
        if (!new_mark(self, r, base, at, lst, n, change)) {
            hits++;
            continue;
        }
        cells += commit_row(self, r, base, at, lst, n, change);
        wrote[k++] = (int32_t)r;
    }
    if (!(rows = PyList_New(k)))
        goto done;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *x = PyLong_FromLong(wrote[i]);
        if (!x)
            goto done;
        PyList_SET_ITEM(rows, i, x);
    }
    result = Py_BuildValue("(LnO)", cells, hits, rows);
done:
    Py_XDECREF(rows);
    if (!small) {
        PyMem_Free(flags);
        PyMem_Free(sim);
        PyMem_Free(touched);
        PyMem_Free(lists);
    }
    if (wrote != wrote_s)
        PyMem_Free(wrote);
    return result;
}
