/* kernel.h: what _kernel.c (the type, commit) and stage.c (stage) share. */
#ifndef BLOCKPREP_KERNEL_H
#define BLOCKPREP_KERNEL_H

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
#define MAX_SLOTS (1 << 16)
#define BK_WORDS(rows) (((rows) + 63) / 64) /* uint64 words of a per-slot row bitmap */
#define BIG LLONG_MIN /* stands for an int beyond int64: out of every range */

/* The scratch of a stage call: the plan's records and one row's work arrays, kept by the kernel
 * between calls (no allocation a call once they have grown). */
typedef struct {
    int32_t *out; /* the plan's records */
    Py_ssize_t used, cap;
    long long *vals;  /* one row's ids */
    PyObject **objs;  /* a row built from ops: its id objects (owned), NULL for a held id */
    int odd;          /* some cell of objs holds an id that is no exact int */
    Py_ssize_t nobjs; /* objs[0..nobjs) hold references */
    Py_ssize_t *chg;  /* its changed positions */
    uint64_t *keys;   /* (value, position) pairs for the repeat check */
    Py_ssize_t row_cap;
    Py_ssize_t *sizes; /* a step of every row: each row's size before the first comparison */
    uint8_t *visit;    /* and whether the walk visits it */
    Py_ssize_t step_cap;
} Scratch;

typedef struct {
    PyObject_HEAD
    int ring;
    int distinct; /* a request's row must not repeat an id (rule 4) */
    Py_ssize_t width, shortest, rows, slots;
    Py_ssize_t stride; /* held row stride: grows with the longest row, at most width */
    long long limit;
    int32_t pad;
    int32_t *held;
    int32_t *lens;
    uint8_t *checked; /* rows: the held ids were checked as a request's (so hold no repeats) */
    int32_t *marks;
    uint64_t *dirty; /* [slots * BK_WORDS(rows)] a row's bit: its mark is not CLEAN (marks.c) */
    uint32_t *stamps;    /* [limit] generation stamps for the repeat check (NULL: limit too big) */
    uint32_t generation;
    int busy; /* inside stage: a callback calling back in is refused */
    Scratch scratch; /* stage's, while busy */
    /* apply_row's slot-0 table and counts (bind): held views, released on dealloc or re-init;
     * bound_table.obj NULL when none */
    Py_buffer bound_table, bound_counts;
    Py_ssize_t bound_column;
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

/* Whether x, an exact int, is the compact int h (a cheap test, no call: 0 and large ints answer
 * 0, and the caller's general walk then decides). The tight loop's test: written through
 * small_value below it cost 8% more instructions a DeepSeek wire step, 15% a ring-table one. */
static inline int small_equals(PyObject *x, int32_t h)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyUnstable_Long_IsCompact((PyLongObject *)x) &&
           PyUnstable_Long_CompactValue((PyLongObject *)x) == h;
#else
    return Py_SIZE(x) == 1 && (long long)((PyLongObject *)x)->ob_digit[0] == h;
#endif
}

/* Whether x, an exact int, is compact (one digit or none: |x| < 2**30 before 3.12); its value
 * in *v if so. A cheap test, no call. */
static inline int small_value(PyObject *x, long long *v)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)x))
        return 0;
    *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)x);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(x);
    if (size < -1 || size > 1)
        return 0;
    *v = size ? size * (long long)((PyLongObject *)x)->ob_digit[0] : 0; /* 0 may hold no digit */
    return 1;
#endif
}

/* ---- a row's change as a slot mark (MARK words: mode, count, p0..p3) ------------------------ */

/* Note position p where a row's new ids differ from its old ones (positions in ascending order):
 * the first MAX_POSITIONS into change[2..], the span's ends into *lo and *hi. */
static inline void bk_note_differ(int32_t p, Py_ssize_t *differ, int32_t *change, int32_t *lo,
                                  int32_t *hi)
{
    if (*differ < MAX_POSITIONS)
        change[2 + *differ] = p;
    if (*lo < 0)
        *lo = p;
    *hi = p + 1;
    (*differ)++;
}

/* Close the mark of the differ positions noted: those positions (at most MAX_POSITIONS), else the
 * whole row (a ring) or the span [lo, hi) (paged). 0 when no position differs. */
static inline int bk_close_mark(const GroupKernel *self, Py_ssize_t differ, int32_t lo,
                                int32_t hi, int32_t *change)
{
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

/* ---- packed records (blockprep/packed.py): kind, group, row, n, then the values ------------ */

enum { R_WHOLE = 1, R_APPEND = 2, R_SET = 3, R_TRUNCATE = 4, R_HEADER = 4 };

/* Word i of a little-endian int32 payload (any host byte order, any alignment). */
static inline int32_t bk_word(const unsigned char *data, Py_ssize_t i)
{
    const unsigned char *b = data + 4 * i;
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24);
}

/* How many value words follow a record's header (n positions and n ids for a set). */
static inline long long bk_record_width(int32_t kind, int32_t n)
{
    return kind == R_TRUNCATE ? 0 : kind == R_SET ? 2LL * n : n;
}

/* Shared between the two files (defined in _kernel.c, or in stage.c for the stage methods). */
const char *bk_type_name(PyObject *x);
int bk_busy(GroupKernel *self);
int bk_int_arg(PyObject *x, const char *name, long long lo, long long hi, long long *out);
PyObject *bk_fault(int code, Py_ssize_t row, PyObject *value);
int bk_grow_held(GroupKernel *self, Py_ssize_t n);
int bk_init_tags(void);
void bk_mark_row(GroupKernel *self, Py_ssize_t r, const int32_t *change);
void bk_mark_all(GroupKernel *self, Py_ssize_t slot);
void bk_unmark_row(GroupKernel *self, Py_ssize_t r);
long long bk_render_row(GroupKernel *self, Py_ssize_t slot, int32_t *table, Py_ssize_t r);
PyObject *bk_apply_row(GroupKernel *self, PyObject *const *args, Py_ssize_t nargs); /* apply_row.c */
PyObject *bk_apply_step(GroupKernel *self, PyObject *const *args, Py_ssize_t nargs);
void bk_scratch_free(Scratch *s); /* stage.c */
PyObject *bk_stage(GroupKernel *self, PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames);
PyObject *bk_index_records(PyObject *module, PyObject *args); /* records.c */

PyObject *bk_step_slots(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *bk_paged_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *bk_differing_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);


#endif
