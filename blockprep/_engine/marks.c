/*
 * marks.c: the per-slot marks of a GroupKernel (what each slot's table lacks of the held ids).
 *
 * marks [slots * rows * MARK] holds, per slot and row, mode, count, p0..p3 (as _engine/rules.py merged).
 * dirty [slots * words] (words = ceil(rows / 64)) has row r's bit set in slot s exactly when
 * that mark is not CLEAN, so commit renders a slot's marked rows, in row order, without
 * scanning every row. Every write of a mark goes through this file, or render (which cleans).
 */
#include "kernel.h"

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

/* A slot's mark after another change (mode, count, positions) of its row: as _engine/rules.py merged. */
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

/* Row r changed (a mode (never CLEAN), count, positions): every slot merges it into its mark. */
void bk_mark_row(GroupKernel *self, Py_ssize_t r, const int32_t *change)
{
    Py_ssize_t words = BK_WORDS(self->rows);
    uint64_t bit = (uint64_t)1 << (r % 64);
    for (Py_ssize_t s = 0; s < self->slots; s++) {
        merge(self->marks + (s * self->rows + r) * MARK, change, self->ring);
        self->dirty[s * words + r / 64] |= bit;
    }
}

/* Every row of a slot (-1: of every slot) marked WHOLE. */
void bk_mark_all(GroupKernel *self, Py_ssize_t slot)
{
    Py_ssize_t first = slot < 0 ? 0 : slot, last = slot < 0 ? self->slots : slot + 1;
    Py_ssize_t words = BK_WORDS(self->rows);
    for (Py_ssize_t s = first; s < last; s++) {
        for (Py_ssize_t r = 0; r < self->rows; r++) {
            int32_t *mk = self->marks + (s * self->rows + r) * MARK;
            mk[0] = WHOLE;
            mk[1] = 0;
        }
        uint64_t *d = self->dirty + s * words;
        for (Py_ssize_t w = 0; w < words; w++) /* only the bits of rows that exist */
            d[w] = self->rows - w * 64 >= 64 ? ~(uint64_t)0
                                             : ((uint64_t)1 << (self->rows - w * 64)) - 1;
    }
}

/* Row r's mark CLEAN in every slot. */
void bk_unmark_row(GroupKernel *self, Py_ssize_t r)
{
    Py_ssize_t words = BK_WORDS(self->rows);
    uint64_t bit = (uint64_t)1 << (r % 64);
    for (Py_ssize_t s = 0; s < self->slots; s++) {
        int32_t *mk = self->marks + (s * self->rows + r) * MARK;
        mk[0] = CLEAN;
        mk[1] = 0;
        self->dirty[s * words + r / 64] &= ~bit;
    }
}
