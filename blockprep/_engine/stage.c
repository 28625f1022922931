/*
 * stage.c: GroupKernel.stage (see _kernel.c for the state and blockprep/_engine/twin.py for the
 * rules): check a step's rows against the held ids and write the plan's records; nothing
 * persistent changes but the held stride (bk_grow_held, values kept). ops.c reads the ops items
 * (bk_stage_item) on the same row step (bk_stage_row) and scratch (stage.h).
 */
#include "stage.h"

#define SCRATCH_KEPT (1 << 16) /* record words, or ids of a row, a kernel keeps between calls */

/* ---- the scratch of one stage call -------------------------------------------------------------- */

void bk_scratch_drop(Scratch *s, Py_ssize_t from)
{
    for (Py_ssize_t p = from; p < s->nobjs; p++)
        Py_CLEAR(s->objs[p]);
    if (from < s->nobjs)
        s->nobjs = from;
}

void bk_scratch_free(Scratch *s)
{
    bk_scratch_drop(s, 0);
    PyMem_Free(s->out);
    PyMem_Free(s->vals);
    PyMem_Free(s->objs);
    PyMem_Free(s->chg);
    PyMem_Free(s->keys);
    PyMem_Free(s->sizes);
    PyMem_Free(s->visit);
}

/* Room for rows of n ids, keeping what the row arrays hold. */
int bk_scratch_row(Scratch *s, Py_ssize_t n)
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

/* Room for records of need words in all (a hint: the records grow past it as they must). */
int bk_scratch_reserve(Scratch *s, Py_ssize_t need)
{
    if (need <= s->cap)
        return 0;
    Py_ssize_t cap = s->cap ? s->cap : 1024;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(int32_t)) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    int32_t *grown = PyMem_Realloc(s->out, sizeof(int32_t) * (size_t)cap);
    if (!grown) {
        PyErr_NoMemory();
        return -1;
    }
    s->out = grown;
    s->cap = cap;
    return 0;
}

int32_t *bk_scratch_record(Scratch *s, Py_ssize_t n)
{
    Py_ssize_t need = s->used + HEADER + n;
    if (need > s->cap && bk_scratch_reserve(s, need) < 0)
        return NULL;
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

/* The value object of position p for a fault: the exact int itself, else its value (the first
 * converted id out of range is kept by bk_stage_row: convert is never called twice). */
static PyObject *value_at(Scratch *s, PyObject *lst, Py_ssize_t p)
{
    PyObject *x = lst ? PyList_GET_ITEM(lst, p) : s->objs[p];
    if (x && PyLong_CheckExact(x)) {
        Py_INCREF(x);
        return x;
    }
    return PyLong_FromLongLong(s->vals[p]);
}

/* A row's ids with nothing held to compare with, read in one pass into vals: each an exact
 * compact int in range (a request's row: [0, limit); a padding row: int32) and, for a request's
 * row of a distinct kernel, not repeated (generation stamps). 1 when every id passed (the row
 * is then checked: rules 1-4 hold), 0 at the first that did not, or when there is no stamp
 * table (the general walk then decides, and words any fault). Runs no Python code. Out of
 * line: inlined into stage_row_ids, its id loop took two more instructions an id once the mark
 * rule moved to kernel.h (a cold DeepSeek step 2,011,106 -> 2,040,738; out of line 2,012,994). */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static int new_row_ids(GroupKernel *self, PyObject *lst, Py_ssize_t n, int padding,
                       long long *vals)
{
    const int stamp = !padding && self->distinct;
    if (stamp && !self->stamps)
        return 0;
    const long long lo = padding ? INT32_MIN : 0, hi = padding ? INT32_MAX : self->limit - 1;
    uint32_t generation = 0;
    if (stamp) {
        if (++self->generation == 0) {
            memset(self->stamps, 0, sizeof(uint32_t) * (size_t)self->limit);
            self->generation = 1;
        }
        generation = self->generation;
    }
    PyObject *const *items = ((PyListObject *)lst)->ob_item;
    PyTypeObject *const int_type = &PyLong_Type;
    for (Py_ssize_t p = 0; p < n; p++) {
#if defined(__GNUC__)
        if (p + 8 < n)
            __builtin_prefetch(items[p + 8]);
#endif
        PyObject *x = items[p];
        long long v;
        if (Py_TYPE(x) != int_type || !small_value(x, &v) || v < lo || v > hi)
            return 0;
        if (stamp) { /* v is in [0, limit): inside the table */
            uint32_t *at = self->stamps + v;
            if (*at == generation)
                return 0;
            *at = generation;
        }
        vals[p] = v;
    }
    return 1;
}

/* The first position from p on where list lst (of at least n ids) does not hold base[0..n) as
 * exact small ints, or n. Runs no Python code (the list cannot change under it): the common
 * row's comparison. */
static inline Py_ssize_t held_prefix(PyObject *lst, Py_ssize_t p, Py_ssize_t n,
                                     const int32_t *base)
{
    PyObject *const *items = ((PyListObject *)lst)->ob_item;
    const Py_ssize_t ahead = n > 8 ? n - 8 : 0;
    PyTypeObject *const int_type = &PyLong_Type;
    for (; p < ahead; p++) { /* the ids are scattered objects: fetch ahead of the walk */
#if defined(__GNUC__)
        __builtin_prefetch(items[p + 8]);
#endif
        PyObject *x = items[p];
        if (Py_TYPE(x) != int_type || !small_equals(x, base[p]))
            return p;
    }
    for (; p < n; p++) {
        PyObject *x = items[p];
        if (Py_TYPE(x) != int_type || !small_equals(x, base[p]))
            return p;
    }
    return n;
}

#define SAME_SWALLOW 1 /* same_as_held: an Exception of an __eq__ is "not equal" */
#define SAME_STRICT 2  /* same_as_held: 2 where an __eq__ would run, before it runs */

/* Whether the list lst (or, with lst NULL, the n cells objs of a row built from ops, a NULL
 * cell the value in vals) holds the ids base[0..m) as Python's list == decides it: from
 * position p on (the ids before p are exact ints equal to the held ones), an exact int by
 * value, any other id by its __eq__, the sizes read again at every position (a callback may
 * change the list). 1 equal, 0 not, -1 with an exception (with SAME_SWALLOW, an Exception is
 * "not equal", as the twin's holds() takes it); with SAME_STRICT, 2 where an __eq__ would run.
 * *called is set when an id's __eq__ ran. */
static int same_as_held(PyObject *lst, PyObject *const *objs, const long long *vals,
                        Py_ssize_t n, const int32_t *base, Py_ssize_t m, Py_ssize_t p,
                        int *called, int flags)
{
    for (;; p++) {
        Py_ssize_t size = lst ? PyList_GET_SIZE(lst) : n;
        if (lst) /* the run of held small ints up to the next other id */
            p = held_prefix(lst, p, size < m ? size : m, base);
        if (p >= size || p >= m)
            return size == m;
        PyObject *x = lst ? PyList_GET_ITEM(lst, p) : objs[p];
        if (!x) { /* a value cell (a held id's: the held object itself) */
            if (vals[p] != base[p])
                return 0;
            continue;
        }
        if (PyLong_CheckExact(x)) {
            if (exact_value(x) != base[p])
                return 0;
            continue;
        }
        if (flags & SAME_STRICT)
            return 2;
        PyObject *h = PyLong_FromLong(base[p]);
        if (!h)
            return -1;
        Py_INCREF(x);
        *called = 1;
        int equal = PyObject_RichCompareBool(x, h, Py_EQ);
        Py_DECREF(x);
        Py_DECREF(h);
        if (equal < 0 && (flags & SAME_SWALLOW) && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();
            return 0;
        }
        if (equal <= 0)
            return equal;
    }
}

/* Decide one visited row: append its record to s->out (or nothing: unchanged). Its n ids are
 * the items of lst (the caller's list) or, with lst NULL, the cells s->objs (NULL cells: a held
 * id, already in s->vals). Returns 0, 1 with *fault_out set, or -1 with an exception; with
 * strict, 2 where Python code would run (an id that is no exact int), before any runs.
 * compared: the twin's holds() comparison of the lists ran already (the row is read again). */
static int stage_row_ids(GroupKernel *self, Scratch *s, Py_ssize_t r, PyObject *lst,
                         Py_ssize_t n, long long src, PyObject *convert, PyObject **fault_out,
                         PyObject **range_obj, Py_ssize_t *range_pos, int compared,
                         int strict)
{
again:;
    const Py_ssize_t W = self->width;
    if (n <= W && bk_grow_held(self, n) < 0) /* before any pointer into held is taken */
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
    if (!lst && s->odd && base && from == r && n == m) {
        /* The twin's holds() on the ids ops made, some of them no exact int: such an id runs
         * its __eq__ there, before the walk (a NULL cell is the held id, in s->vals). */
        int called = 0, same = same_as_held(NULL, s->objs, s->vals, n, base, m, 0, &called,
                                               SAME_SWALLOW);
        if (same)
            return same == 1 ? 0 : same;
    }
    /* 0. The common row: its leading ids are the held ids as exact small ints. This loop runs
     * no Python code (the list cannot change under it); the walk below takes over at the
     * first other id. */
    Py_ssize_t p = 0;
    if (lst && base) {
        p = held_prefix(lst, 0, n < m ? n : m, base);
        if (p == n && from == r && n == m)
            return 0; /* it holds exactly what it held: nothing to check or write */
        if (!compared && from == r && n == m &&
            !(PyLong_CheckExact(PyList_GET_ITEM(lst, p)) &&
              exact_value(PyList_GET_ITEM(lst, p)) != base[p])) {
            /* The twin's holds(): the lists compared as Python compares them, from the first
             * id that is no held small int on (an id that is no exact int runs its __eq__). */
            int called = 0, same = same_as_held(lst, NULL, NULL, n, base, m, p, &called,
                                                   SAME_SWALLOW | (strict ? SAME_STRICT : 0));
            if (same)
                return same == 1 ? 0 : same;
            if (called) { /* a callback ran: the row is read again, as the twin reads it */
                n = PyList_GET_SIZE(lst);
                compared = 1;
                goto again;
            }
        }
    }
    if (bk_scratch_row(s, n) < 0)
        return -1;
    long long *vals = s->vals;
    for (Py_ssize_t q = 0; q < p; q++)
        vals[q] = base[q];
    Py_ssize_t nchg = 0;
    /* 0b. A row with nothing held to compare with (a request new to the table): one pass, then
     * straight to its mark; at the first doubt the general walk starts the row over. */
    if (lst && !base && n <= W && (padding ? !(self->ring && n == 0) : n >= self->shortest) &&
        new_row_ids(self, lst, n, padding, vals))
        goto marked;
    /* 1. ids: unchanged ones are the held ids; changed ones plain ints (others converted). */
    for (; p < n; p++) {
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
        } else if (strict) {
            return 2; /* Python code would run: the caller stages the step in the twin's order */
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
                if (equal < 0 && !PyErr_ExceptionMatches(PyExc_Exception)) {
                    Py_DECREF(x); /* KeyboardInterrupt and the like go on up, as in the twin */
                    return -1;
                }
                if (equal < 0) { /* an id whose comparison fails is not the held id */
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
                *fault_out = bk_fault(F_TYPE, r, x);
                Py_DECREF(c);
                Py_DECREF(x);
                return *fault_out ? 1 : -1;
            }
            v = exact_value(c);
            int out = padding ? (v == BIG || v < INT32_MIN || v > INT32_MAX)
                              : (v == BIG || v < 0 || v >= self->limit);
            if (out && !*range_obj) { /* the value a RANGE fault would name */
                *range_obj = c;
                *range_pos = p;
            } else {
                Py_DECREF(c);
            }
            Py_DECREF(x);
        }
        vals[p] = v;
        s->chg[nchg++] = p;
        if (lst && base) { /* back to the common case: the next ids are the held ones */
            PyObject *const *items = ((PyListObject *)lst)->ob_item; /* size n: checked above */
            const Py_ssize_t same = n < m ? n : m;
            Py_ssize_t q = p + 1;
            for (; q < same && Py_TYPE(items[q]) == &PyLong_Type && small_equals(items[q], base[q]);
                 q++)
                vals[q] = base[q];
            p = q - 1;
        }
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
        *fault_out = bk_fault(F_LENGTH, r, value);
        Py_DECREF(value);
        return *fault_out ? 1 : -1;
    }
    for (Py_ssize_t i = 0; i < nchg; i++) {
        long long v = vals[s->chg[i]];
        int bad = padding ? (v == BIG || v < INT32_MIN || v > INT32_MAX)
                          : (v == BIG || v < 0 || v >= self->limit);
        if (bad) {
            PyObject *value = s->chg[i] == *range_pos ? (Py_INCREF(*range_obj), *range_obj)
                                                      : value_at(s, lst, s->chg[i]);
            if (!value)
                return -1;
            *fault_out = bk_fault(padding ? F_PAD_RANGE : F_RANGE, r, value);
            Py_DECREF(value);
            return *fault_out ? 1 : -1;
        }
    }
    if (!padding && nchg && self->distinct) {
        Py_ssize_t j = first_repeat(self, s, n, nchg, src >= 0 && self->checked[src]);
        if (j < n) {
            PyObject *value = PyLong_FromLongLong(vals[j]);
            if (!value)
                return -1;
            *fault_out = bk_fault(F_REPEAT, r, value);
            Py_DECREF(value);
            return *fault_out ? 1 : -1;
        }
    }
marked:
    /* The mark: what a slot holding a render of row r's held ids must write. */
    int32_t om = self->lens[r];
    const int32_t *old = self->held + r * stride;
    int32_t change[MARK] = {WHOLE, 0, 0, 0, 0, 0};
    if (!(om < 0 || (self->ring && om != n))) {
        Py_ssize_t shorter = n < om ? n : om, longer = n < om ? om : n, differ = 0;
        int32_t lo = -1, hi = -1;
        if (base == old && om == n) { /* it stayed: only the changed positions can differ */
            for (Py_ssize_t i = 0; i < nchg; i++)
                if (vals[s->chg[i]] != old[s->chg[i]])
                    bk_note_differ((int32_t)s->chg[i], &differ, change, &lo, &hi);
        } else {
            for (Py_ssize_t p = 0; p < longer; p++)
                if (p >= shorter || vals[p] != old[p])
                    bk_note_differ((int32_t)p, &differ, change, &lo, &hi);
        }
        if (!bk_close_mark(self, differ, lo, hi, change))
            return 0; /* it holds exactly what it held */
    }
    int32_t *rec = bk_scratch_record(s, n);
    if (!rec)
        return -1;
    rec[0] = (int32_t)r;
    rec[1] = (int32_t)n;
    rec[2] = change[0] | (padding || !self->distinct ? 0 : CHECKED);
    memcpy(rec + 3, change + 1, sizeof(int32_t) * (MARK - 1)); /* count, p0..p3 */
    for (Py_ssize_t p = 0; p < n; p++)
        rec[HEADER + p] = (int32_t)vals[p];
    return 0;
}

/* srcs[r] as a source row: PADDING, NEW or a row; -1 with ValueError otherwise. */
int bk_read_src(GroupKernel *self, PyObject *srcs, long long r, long long *src)
{
    PyObject *so = PyList_GET_ITEM(srcs, r);
    long long v = PyLong_CheckExact(so) ? exact_value(so) : BIG;
    if (!(v == PADDING || v == NEW || (0 <= v && v < self->rows))) {
        PyErr_Format(PyExc_ValueError, "srcs[%lld] must be -2, -1 or a row, got %R", r, so);
        return -1;
    }
    *src = v;
    return 0;
}

/* The staged records as the (plan, None) a stage returns. */
PyObject *bk_finished_plan(Scratch *s)
{
    PyObject *plan = PyBytes_FromStringAndSize((const char *)s->out,
                                               (Py_ssize_t)sizeof(int32_t) * s->used);
    return plan ? Py_BuildValue("(NO)", plan, Py_None) : NULL;
}

/* stage_row_ids, then the converted id it kept for a RANGE fault released. */
int bk_stage_row(GroupKernel *self, Scratch *s, Py_ssize_t r, PyObject *lst, Py_ssize_t n,
                 long long src, PyObject *convert, PyObject **fault_out, int strict)
{
    PyObject *range_obj = NULL;
    Py_ssize_t range_pos = -1;
    int status = stage_row_ids(self, s, r, lst, n, src, convert, fault_out, &range_obj,
                               &range_pos, 0, strict);
    Py_XDECREF(range_obj);
    return status;
}

/* The key object of dict d equal to str key (a new reference), else key itself. A batch's rows
 * are dicts that share their key objects (pickle's memo; msgspec's key cache): looked up with
 * that object, each row's lookup ends at the identity test, not at a hash and memcmp compare
 * (~140 instructions a lookup, 560 a DeepSeek step). Only exact strs: no __eq__ runs. */
static PyObject *shared_key(PyObject *d, PyObject *key)
{
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    if (PyDict_CheckExact(d) && PyUnicode_CheckExact(key))
        while (PyDict_Next(d, &pos, &k, &v))
            if (k == key || (PyUnicode_CheckExact(k) && PyUnicode_Compare(k, key) == 0)) {
                Py_INCREF(k);
                return k;
            }
    Py_INCREF(key);
    return key;
}

/* A new list of rows[i][key] for every row (each an exact dict); NULL with TypeError or KeyError
 * (the twin's words) at the first row that is no dict or holds no key. */
static PyObject *lists_at(PyObject *rows, PyObject *given)
{
    const Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(n);
    if (!out)
        return NULL;
    PyObject *key = n ? shared_key(PyList_GET_ITEM(rows, 0), given) : (Py_INCREF(given), given);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_GET_SIZE(rows) != n) { /* a key's __eq__ may change the caller's list */
            PyErr_SetString(PyExc_RuntimeError, "the step changed while it was planned");
            goto fail;
        }
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyDict_CheckExact(row)) {
            PyErr_Format(PyExc_TypeError, "row %zd must be a dict, got %s", i, bk_type_name(row));
            goto fail;
        }
        Py_INCREF(row); /* the lookup may run a key's __eq__, which may drop the row */
        PyObject *found = PyDict_GetItemWithError(row, key);
        Py_XINCREF(found);
        Py_DECREF(row);
        if (!found) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "row %zd holds no %R", i, given);
            goto fail;
        }
        PyList_SET_ITEM(out, i, found);
    }
    Py_DECREF(key);
    return out;
fail:
    Py_DECREF(key);
    Py_DECREF(out); /* the items not set are NULL, which a list's dealloc skips */
    return NULL;
}

/* The held row r as the twin holds it: None or a new list of ints. */
static PyObject *held_object(GroupKernel *self, Py_ssize_t r)
{
    const Py_ssize_t m = self->lens[r];
    if (m < 0)
        Py_RETURN_NONE;
    PyObject *out = PyList_New(m);
    for (Py_ssize_t p = 0; out && p < m; p++) {
        PyObject *x = PyLong_FromLong(self->held[r * self->stride + p]);
        if (!x)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, p, x);
    }
    return out;
}

/* The twin's _plain: every item of a step of every row is a list and every src an int source
 * (PADDING, NEW or a row); the twin then compares every row first. Runs no Python code. */
static int plain_step(GroupKernel *self, PyObject *items, PyObject *srcs)
{
    for (Py_ssize_t i = 0; i < self->rows; i++) {
        PyObject *src = PyList_GET_ITEM(srcs, i);
        long long v = PyLong_CheckExact(src) ? exact_value(src) : BIG;
        if (!PyList_CheckExact(PyList_GET_ITEM(items, i)) || v == BIG || v < PADDING ||
            v >= self->rows)
            return 0;
    }
    return 1;
}

/* Whether srcs[i] has row i visited whatever it holds: a source other than itself or PADDING
 * (an src that is no exact int too: its walk refuses it). */
static inline int moved_row(PyObject *srcs, Py_ssize_t i)
{
    PyObject *src = PyList_GET_ITEM(srcs, i);
    long long v = PyLong_CheckExact(src) ? exact_value(src) : BIG;
    return v != i && v != PADDING;
}

/* Whether items[r] differs from held row r as Python's != decides it (the twin's held row is
 * None when unknown: any list differs), reading the row where no Python code runs, else first
 * taking the rows' sizes (s->sizes) if not taken yet (*called: taken, some Python code may
 * have run). 1, 0, or -1 with an exception. */
static int row_differs(GroupKernel *self, Scratch *s, PyObject *items, Py_ssize_t r,
                       int *called)
{
    PyObject *lst = PyList_GET_ITEM(items, r);
    const Py_ssize_t m = self->lens[r];
    const int32_t *base = self->held + r * self->stride;
    Py_ssize_t p = 0;
    if (PyList_CheckExact(lst)) {
        if (m < 0 || PyList_GET_SIZE(lst) != m)
            return 1;
        p = held_prefix(lst, 0, m, base);
        if (p == m)
            return 0;
    }
    if (!*called) { /* what a callback could change: the sizes as they were */
        for (Py_ssize_t i = 0; i < self->rows; i++)
            s->sizes[i] = PyList_GET_SIZE(PyList_GET_ITEM(items, i));
        *called = 1;
    }
    Py_INCREF(lst); /* a callback may drop it from items */
    int d;
    if (PyList_CheckExact(lst)) {
        int ran = 0, same = same_as_held(lst, NULL, NULL, m, base, m, p, &ran, 0);
        d = same < 0 ? -1 : !same;
    } else { /* a callback put something else there: compared as Python compares it */
        PyObject *held = held_object(self, r);
        PyObject *ne = held ? PyObject_RichCompare(lst, held, Py_NE) : NULL;
        Py_XDECREF(held);
        d = ne ? PyObject_IsTrue(ne) : -1;
        Py_XDECREF(ne);
    }
    Py_DECREF(lst);
    return d;
}

/* The rows a step of every row visits (rows None, id lists), as the twin decides them: when
 * every item is a list and every src an int source, one comparison of each row's list with its
 * held ids (Python's !=, in row order: an id that is no exact int runs its __eq__) finds the
 * rows that stay and hold what they held, and only the others are visited (visit[r]); a
 * comparison that raises an Exception, or a step whose lists changed size under it, visits every
 * row. Then a row whose size changed under a comparison is refused ("changed while it was
 * planned"). 1 with visit[] set, 0 every row visited, -1 with an exception. */
static int rows_to_visit(GroupKernel *self, Scratch *s, PyObject *items, PyObject *srcs)
{
    const Py_ssize_t n = self->rows;
    if (n > s->step_cap) {
        Py_ssize_t *sizes = PyMem_Realloc(s->sizes, sizeof(Py_ssize_t) * (size_t)n);
        if (sizes)
            s->sizes = sizes;
        uint8_t *visit = PyMem_Realloc(s->visit, (size_t)n);
        if (visit)
            s->visit = visit;
        if (!sizes || !visit) {
            PyErr_NoMemory();
            return -1;
        }
        s->step_cap = n;
    }
    if (!plain_step(self, items, srcs))
        return 0;
    uint8_t *visit = s->visit;
    for (Py_ssize_t i = 0; i < n; i++)
        visit[i] = (uint8_t)moved_row(srcs, i);
    int every = 0, called = 0;
    Py_ssize_t compared = 0; /* map() stops at the end of the shorter of items and held */
    for (; compared < PyList_GET_SIZE(items) && compared < n; compared++) {
        int d = row_differs(self, s, items, compared, &called);
        if (d < 0) {
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                return -1;
            PyErr_Clear(); /* the twin's every-row walk decides (and words) it */
            every = 1;
            break;
        }
        visit[compared] |= (uint8_t)d;
    }
    if (!called) /* no Python code ran: nothing changed */
        return 1;
    if (!every && (compared != n || PyList_GET_SIZE(srcs) != n))
        every = 1; /* zip(strict=True) refuses: every row */
    for (Py_ssize_t i = 0; !every && i < n; i++) /* the sources as they are now */
        visit[i] |= (uint8_t)moved_row(srcs, i);
    Py_ssize_t changed = -1; /* the twin's same_lengths: every size read, then compared */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        Py_ssize_t size = PyObject_Size(PyList_GET_ITEM(items, i));
        if (size < 0)
            return -1;
        if (changed < 0 && (i >= n || size != s->sizes[i]))
            changed = i;
    }
    if (changed >= 0 && PyList_GET_SIZE(items) == n) {
        PyErr_Format(PyExc_RuntimeError, "row %zd changed while it was planned", changed);
        return -1;
    }
    return !every;
}

/* Whether the twin, staging this step of every row, would run Python code (an id's __eq__)
 * when it first compares rows from..rows-1 with their held ids (rows_to_visit; a step that is
 * not plain is compared row by row as it is walked). Runs none. */
static int compare_runs_python(GroupKernel *self, PyObject *items, PyObject *srcs,
                               Py_ssize_t from)
{
    const Py_ssize_t n = self->rows;
    if (!plain_step(self, items, srcs))
        return 0;
    for (Py_ssize_t r = from; r < n; r++) {
        PyObject *lst = PyList_GET_ITEM(items, r);
        const Py_ssize_t m = self->lens[r];
        if (m < 0 || PyList_GET_SIZE(lst) != m)
            continue;
        const int32_t *base = self->held + r * self->stride;
        int called = 0;
        if (same_as_held(lst, NULL, NULL, m, base, m, 0, &called, SAME_STRICT) == 2)
            return 1;
    }
    return 0;
}

/* GroupKernel.stage: every visited row's new ids in one of two encodings, an id list per row, or
 * (ops) per row its wire ops or packed record offsets (bk_stage_item); see the twin. */
PyObject *bk_stage(GroupKernel *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* Vectorcall: a call with keywords builds no dict (PyArg_ParseTupleAndKeywords' dict and
     * tuple cost about 3,000 instructions a call). */
    static const char *const names[] = {"rows", "items", "srcs", "convert", "key", "ops", "data"};
    PyObject *arg[7] = {NULL, NULL, NULL, NULL, Py_None, Py_False, Py_None};
    if (nargs > 5) {
        PyErr_Format(PyExc_TypeError, "stage takes at most 5 positional arguments (%zd given)",
                     nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        arg[i] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    static PyObject *interned[7]; /* the names as the interpreter's interned strs: compared by
                                   * identity first, as a call's keyword names are interned */
    for (int j = 0; !interned[6] && j < 7; j++)
        if (!(interned[j] = PyUnicode_InternFromString(names[j])))
            return NULL;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int at = -1;
        for (int j = 0; at < 0 && j < 7; j++)
            if (name == interned[j])
                at = j;
        for (int j = 0; at < 0 && j < 7; j++)
            if (PyUnicode_CompareWithASCIIString(name, names[j]) == 0)
                at = j;
        if (at < 0 || at < nargs) {
            PyErr_Format(PyExc_TypeError,
                         at < 0 ? "stage got an unexpected keyword argument %R"
                                : "stage got multiple values for argument %R",
                         name);
            return NULL;
        }
        arg[at] = args[nargs + k];
    }
    for (int j = 0; j < 4; j++)
        if (!arg[j]) {
            PyErr_Format(PyExc_TypeError, "stage missing required argument '%s'", names[j]);
            return NULL;
        }
    PyObject *rows = arg[0], *items = arg[1], *srcs = arg[2], *convert = arg[3], *key = arg[4],
             *packed = arg[6];
    const int ops = PyObject_IsTrue(arg[5]);
    if (ops < 0)
        return NULL;
    if (!PyList_CheckExact(items) || !PyList_CheckExact(srcs) ||
        (rows != Py_None && !PyList_CheckExact(rows))) {
        PyErr_SetString(PyExc_TypeError, "rows (or None), items and srcs must be lists");
        return NULL;
    }
    if (packed != Py_None &&
        (!ops || !PyBytes_CheckExact(packed) || PyBytes_GET_SIZE(packed) % 4)) {
        PyErr_SetString(PyExc_TypeError,
                        "data must be None or, with ops, bytes of whole int32 words");
        return NULL;
    }
    /* bytes are immutable: the payload stays put while callbacks run (packed is the caller's
     * reference, held for the call) */
    const unsigned char *data =
        packed == Py_None ? NULL : (const unsigned char *)PyBytes_AS_STRING(packed);
    const Py_ssize_t words = packed == Py_None ? 0 : PyBytes_GET_SIZE(packed) / 4;
    if (PyList_GET_SIZE(srcs) != self->rows) {
        PyErr_Format(PyExc_ValueError, "srcs must hold %zd rows, got %zd", self->rows,
                     PyList_GET_SIZE(srcs));
        return NULL;
    }
    Py_ssize_t visits = rows == Py_None ? self->rows : PyList_GET_SIZE(rows);
    if (PyList_GET_SIZE(items) != visits) {
        PyErr_Format(PyExc_ValueError, "items must hold %zd rows, got %zd", visits,
                     PyList_GET_SIZE(items));
        return NULL;
    }
    if (bk_busy(self))
        return NULL;
    if (key == Py_None) {
        Py_INCREF(items);
    } else if (rows != Py_None) {
        PyErr_SetString(PyExc_ValueError, "key applies only to a step of every row (rows None)");
        return NULL;
    } else if (!(items = lists_at(items, key))) {
        return NULL;
    }
    self->busy = 1;
    Scratch *s = &self->scratch;
    s->used = 0;
    PyObject *fault_value = NULL, *result = NULL;
    /* A first step (row 0 holds nothing yet): room for a record of each row that holds nothing
     * (growing by doubling copied a cold DeepSeek step's records 3-4 times). A hint, the records
     * grow past it as they must; a steady step skips the walk. */
    Py_ssize_t hint = 0;
    int first = !ops && rows == Py_None && visits > 0 && self->lens[0] < 0;
    for (Py_ssize_t i = 0; first && i < visits; i++) {
        PyObject *lst = PyList_GET_ITEM(items, i);
        if (self->lens[i] < 0 && PyList_CheckExact(lst) && PyList_GET_SIZE(lst) <= self->width)
            hint += HEADER + PyList_GET_SIZE(lst); /* a longer row is a fault, never staged */
    }
    if (bk_scratch_reserve(s, hint) < 0)
        goto done;
    /* A step of every row by id lists is walked row by row while no Python code runs (exact
     * ints: the order is not observable); at the first id that is no exact int, it starts over
     * in the twin's order (rows_to_visit first), so that callbacks run as they run there. */
    int strict = !ops && rows == Py_None, some = 0;
walk:
    for (Py_ssize_t i = 0; i < visits; i++) {
        long long r = i, src;
        if (some && !s->visit[i])
            continue;
        /* rows, items and srcs are the caller's: callbacks may change them. */
        if ((rows != Py_None && PyList_GET_SIZE(rows) != visits) ||
            PyList_GET_SIZE(items) != visits || PyList_GET_SIZE(srcs) != self->rows) {
            PyErr_SetString(PyExc_RuntimeError, "the step changed while it was planned");
            goto done;
        }
        if (rows != Py_None && bk_int_arg(PyList_GET_ITEM(rows, i), "row", 0, self->rows, &r) < 0)
            goto done;
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!ops && !PyList_CheckExact(item)) {
            PyErr_Format(PyExc_TypeError, "row %lld must be a list, got %s", r,
                         bk_type_name(item));
            goto done;
        }
        if (bk_read_src(self, srcs, r, &src) < 0)
            goto done;
        Py_INCREF(item);
        int status = ops ? bk_stage_item(self, s, (Py_ssize_t)r, src, item, data, words, convert,
                                         &fault_value)
                         : bk_stage_row(self, s, (Py_ssize_t)r, item, PyList_GET_SIZE(item), src,
                                        convert, &fault_value, strict);
        Py_DECREF(item);
        if (status == 0)
            continue;
        if (status == 2 ||
            (status == 1 && strict && compare_runs_python(self, items, srcs, i + 1))) {
            Py_CLEAR(fault_value);
            bk_scratch_drop(s, 0);
            s->used = 0;
            strict = 0;
            if ((some = rows_to_visit(self, s, items, srcs)) < 0)
                goto done;
            goto walk;
        }
        if (status > 0)
            result = fault_value;
        goto done;
    }
    if (some) { /* the twin checks the step's sizes once more unless it visited the last row */
        Py_ssize_t last = visits - 1;
        while (last >= 0 && !s->visit[last])
            last--;
        if (last >= 0 && last < visits - 1 &&
            (PyList_GET_SIZE(items) != visits || PyList_GET_SIZE(srcs) != self->rows)) {
            PyErr_SetString(PyExc_RuntimeError, "the step changed while it was planned");
            goto done;
        }
    }
    result = bk_finished_plan(s);
done:
    self->busy = 0;
    bk_scratch_drop(s, 0);
    if (s->cap > SCRATCH_KEPT || s->row_cap > SCRATCH_KEPT) { /* a big step's: not kept */
        bk_scratch_free(s);
        memset(s, 0, sizeof *s);
    }
    Py_DECREF(items);
    return result;
}
