/* optim family: the work table every ISA level shares (include after RC_INLINE and rc_common.h).
 *
 * The elements of all t tensors of a call in chunks of CHUNK (a tensor's last chunk may be
 * shorter), numbered across the tensors: a parallel region hands them out and a chunk finds its
 * tensor by binary search in the prefix table `start` (empty tensors own no chunk).
 */
#ifndef RC_OPTIM_JOB_H
#define RC_OPTIM_JOB_H
#include <stdlib.h>

enum { CHUNK = 16384 };

/* One tensor's buffers (the state slots its rule uses, else NULL); a tail points at scratch. */
typedef struct {
    void *p;
    uint16_t *b;
    const void *g;
    float *s[3];
} Bufs;

/* The call's tensors; tensor k holds the global chunks [start[k], start[k + 1]). */
typedef struct {
    int64_t t, chunks, *start;
    const int64_t *n;
    void *const *p, *const *b, *const *g, *const *s[3];
    int split, gbf16;
} Job;

/* The chunk table (and, for lamb, 2 doubles per chunk and a float per tensor after it). */
static int job_init(Job *j, int64_t t, const int64_t *n, void *const *p, void *const *b,
                    void *const *g, void *const *s0, void *const *s1, void *const *s2, int gbf16,
                    int lamb)
{
    int64_t chunks = 0;
    for (int64_t k = 0; k < t; k++)
        chunks += (n[k] + CHUNK - 1) / CHUNK;
    size_t bytes = (size_t)(t + 1) * 8 + (lamb ? (size_t)chunks * 16 + (size_t)t * 4 : 0);
    *j = (Job){t, chunks, malloc(bytes), n, p, b, g, {s0, s1, s2}, b != NULL, gbf16 != 0};
    if (j->start == NULL)
        return -1;
    j->start[0] = 0;
    for (int64_t k = 0; k < t; k++)
        j->start[k + 1] = j->start[k] + (n[k] + CHUNK - 1) / CHUNK;
    return 0;
}

/* Global chunk c: its tensor (returned), buffers and element range [lo, hi). */
RC_INLINE int64_t locate(const Job *j, int64_t c, Bufs *q, int64_t *lo, int64_t *hi)
{
    int64_t a = 0, z = j->t; /* the last k with start[k] <= c (empty tensors are skipped) */
    while (z - a > 1) {
        int64_t mid = a + (z - a) / 2;
        *(j->start[mid] <= c ? &a : &z) = mid;
    }
    *lo = (c - j->start[a]) * CHUNK;
    *hi = rc_min64(j->n[a], *lo + CHUNK);
    *q = (Bufs){j->p[a], j->b ? (uint16_t *)j->b[a] : NULL, j->g[a], {NULL, NULL, NULL}};
    for (int x = 0; x < 3; x++)
        q->s[x] = j->s[x] ? (float *)j->s[x][a] : NULL;
    return a;
}

#endif
