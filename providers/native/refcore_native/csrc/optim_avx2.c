/* optim family, AVX2 (+FMA): fused multi-tensor steps of sgd, adagrad, adam, adamw, lamb.
 *
 * Work: the elements of all t tensors in chunks of CHUNK (a tensor's last chunk may be shorter),
 * numbered across the tensors; one parallel region per call hands them out dynamically (a chunk
 * finds its tensor by binary search in a prefix table), so many small tensors share one region.
 * A chunk runs 8-lane vectors, then its partial tail through the same vector code on zero-padded
 * copies (nothing outside a buffer is read or written).
 *
 * Arithmetic: float32, in the reference's order, each stored state re-read as stored. Every
 * a * b + c of the reference is an explicit fmadd / fnmadd / fmsub and every other product feeds
 * a division, a sqrt or an fma's addend, so gcc's contraction finds nothing to fuse and the four
 * load/store variants (float32 or split_bf16 master x float32 or bf16 grad, instantiated with
 * constant flags per chunk) run the same arithmetic: the split master is joined to its float32
 * bits at the load and split (truncated) at the store, so its bits equal the float32 master's.
 * Special values propagate as in the reference (amsgrad's max keeps a NaN of either operand).
 *
 * lamb: pass 1 updates m, v and sums p^2 and u^2 per chunk in double (lane-wise accumulators
 * reduced in a fixed order); one thread then forms each tensor's trust ratio from its chunks'
 * sums in chunk order (no dependence on the thread count); pass 2 recomputes u from the stored
 * m, v and writes p - lr * ratio * u. The passes share one parallel region.
 */
#define RC_LEVEL avx2

#include <stdlib.h>

#include "optim.h"
#include "rc_avx2.h"

enum { VL = 8 };
typedef __m256 V;

#include "rc_optim_job.h"

/* The master at element i: float32, or the split pair joined (top << 16 | bottom). */
RC_INLINE V ld_p(const Bufs *q, int64_t i, int split)
{
    if (!split)
        return _mm256_loadu_ps((const float *)q->p + i);
    __m128i t = _mm_loadu_si128((const __m128i *)((const uint16_t *)q->p + i));
    __m128i u = _mm_loadu_si128((const __m128i *)(q->b + i));
    __m256i w = _mm256_set_m128i(_mm_unpackhi_epi16(u, t), _mm_unpacklo_epi16(u, t));
    return _mm256_castsi256_ps(w);
}

/* Store the master: float32, or split (top = bits >> 16, bottom = bits & 0xFFFF). */
RC_INLINE void st_p(const Bufs *q, int64_t i, V x, int split)
{
    if (!split) {
        _mm256_storeu_ps((float *)q->p + i, x);
        return;
    }
    const __m256i lohi = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                                          1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    __m256i y = _mm256_shuffle_epi8(_mm256_castps_si256(x), lohi); /* per 128: bottoms, tops */
    y = _mm256_permute4x64_epi64(y, 0xD8);                          /* 8 bottoms, 8 tops */
    _mm_storeu_si128((__m128i *)(q->b + i), _mm256_castsi256_si128(y));
    _mm_storeu_si128((__m128i *)((uint16_t *)q->p + i), _mm256_extracti128_si256(y, 1));
}

#define LD_G(q, i, gbf16) rc8_load((q)->g, i, gbf16)
#define LD_S(q, x, i) _mm256_loadu_ps((q)->s[x] + (i))
#define ST_S(q, x, i, v) _mm256_storeu_ps((q)->s[x] + (i), v)
#define NEG(x) _mm256_xor_ps(x, _mm256_set1_ps(-0.0f))
#define SET(x) _mm256_set1_ps((float)(x))

/* Zero-padded copies of elements [i, i + n), n < VL, for the tail; *tq points at them. */
typedef struct {
    _Alignas(32) float p[VL], g[VL], s[3][VL];
    uint16_t b[VL];
} Pad;

RC_INLINE void pad_in(Pad *d, Bufs *tq, const Bufs *q, int64_t i, int64_t n, int split,
                      int gbf16)
{
    size_t pe = split ? 2 : 4, ge = gbf16 ? 2 : 4;
    memset(d, 0, sizeof *d);
    memcpy(d->p, (const char *)q->p + i * pe, n * pe);
    memcpy(d->g, (const char *)q->g + i * ge, n * ge);
    *tq = (Bufs){d->p, q->b ? d->b : NULL, d->g, {NULL, NULL, NULL}};
    if (q->b)
        memcpy(d->b, q->b + i, n * 2);
    for (int x = 0; x < 3; x++)
        if (q->s[x])
            memcpy(tq->s[x] = d->s[x], q->s[x] + i, n * 4);
}

/* Copy back what the step wrote: the master (wp) and the states (ws). */
RC_INLINE void pad_out(const Pad *d, const Bufs *q, int64_t i, int64_t n, int split, int wp,
                       int ws)
{
    if (wp) {
        memcpy((char *)q->p + i * (split ? 2 : 4), d->p, n * (split ? 2 : 4));
        if (q->b)
            memcpy(q->b + i, d->b, n * 2);
    }
    for (int x = 0; ws && x < 3; x++)
        if (q->s[x])
            memcpy(q->s[x] + i, d->s[x], n * 4);
}

/* Elements [lo, hi) of one tensor through vec (vectors, then the padded tail). */
#define SPAN(vec, h, q, lo, hi, split, gbf16, wp, ws)                                              \
    do {                                                                                           \
        int64_t i_ = (lo);                                                                         \
        for (; i_ + VL <= (hi); i_ += VL)                                                          \
            vec(h, q, i_, split, gbf16);                                                           \
        if (i_ < (hi)) {                                                                           \
            Pad d_;                                                                                \
            Bufs t_;                                                                               \
            pad_in(&d_, &t_, q, i_, (hi) - i_, split, gbf16);                                      \
            vec(h, &t_, 0, split, gbf16);                                                          \
            pad_out(&d_, q, i_, (hi) - i_, split, wp, ws);                                         \
        }                                                                                          \
    } while (0)

/* CALL(split, gbf16) with both flags as constants: four specialised copies of the chunk code. */
#define DISPATCH(job, CALL)                                                                        \
    switch ((job)->split * 2 + (job)->gbf16) {                                                     \
    case 0: CALL(0, 0); break;                                                                     \
    case 1: CALL(0, 1); break;                                                                     \
    case 2: CALL(1, 0); break;                                                                     \
    default: CALL(1, 1); break;                                                                    \
    }

/* The chunks of the job, each through CALL(split, gbf16) (an omp for: inside a region). */
#define CHUNKS(job, CALL)                                                                          \
    RC_PRAGMA(omp for schedule(dynamic, 1))                                                        \
    for (int64_t c = 0; c < (job)->chunks; c++) {                                                  \
        Bufs q;                                                                                    \
        int64_t lo, hi, k = locate(job, c, &q, &lo, &hi);                                          \
        (void)k;                                                                                   \
        DISPATCH(job, CALL)                                                                        \
    }
#define PARALLEL(nt) RC_PRAGMA(omp parallel num_threads(rc_threads(nt)) if (nt != 1))

/* ---- sgd: d = +-g (+ wd p); b = d (fresh) or mom b + (1 - damp) d; d = d + mom b or b ---- */
typedef struct {
    V lr, wd, mom, damp1;
    int wd_on, mom_on, nesterov, maximize, fresh;
} Sgd;

RC_INLINE void sgd_vec(const Sgd *h, const Bufs *q, int64_t i, int split, int gbf16)
{
    V p = ld_p(q, i, split), d = LD_G(q, i, gbf16);
    if (h->maximize)
        d = NEG(d);
    if (h->wd_on)
        d = _mm256_fmadd_ps(h->wd, p, d);
    if (h->mom_on) {
        V b = h->fresh ? d : _mm256_fmadd_ps(h->mom, LD_S(q, 0, i), _mm256_mul_ps(h->damp1, d));
        ST_S(q, 0, i, b);
        d = h->nesterov ? _mm256_fmadd_ps(h->mom, b, d) : b;
    }
    st_p(q, i, _mm256_fnmadd_ps(h->lr, d, p), split);
}

int RC_FN(rc_sgd)(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                  void *const *momentum_buffer, int grad_bf16, double lr, double momentum,
                  double dampening, double weight_decay, int nesterov, int maximize, int fresh,
                  int nt)
{
    Job job;
    void *const *buf = momentum != 0.0 ? momentum_buffer : NULL;
    if (job_init(&job, t, n, p, bot, g, buf, NULL, NULL, grad_bf16, 0))
        return -1;
    const Sgd h = {SET(lr),     SET(weight_decay),   SET(momentum), SET(1.0 - dampening),
                   weight_decay != 0.0, momentum != 0.0, nesterov,   maximize,
                   fresh};
#define CALL(s, b) SPAN(sgd_vec, &h, &q, lo, hi, s, b, 1, 1)
    PARALLEL(nt) CHUNKS(&job, CALL)
#undef CALL
    free(job.start);
    return 0;
}

/* ---- adagrad: g = +-g (+ wd p); sum += g^2; p -= clr g / (sqrt(sum) + eps) ---- */
typedef struct {
    V clr, wd, eps;
    int wd_on, maximize;
} Adagrad;

RC_INLINE void adagrad_vec(const Adagrad *h, const Bufs *q, int64_t i, int split, int gbf16)
{
    V p = ld_p(q, i, split), d = LD_G(q, i, gbf16);
    if (h->maximize)
        d = NEG(d);
    if (h->wd_on)
        d = _mm256_fmadd_ps(h->wd, p, d);
    V s = _mm256_fmadd_ps(d, d, LD_S(q, 0, i));
    ST_S(q, 0, i, s);
    V u = _mm256_div_ps(_mm256_mul_ps(h->clr, d), _mm256_add_ps(_mm256_sqrt_ps(s), h->eps));
    st_p(q, i, _mm256_sub_ps(p, u), split);
}

int RC_FN(rc_adagrad)(int64_t t, const int64_t *n, void *const *p, void *const *bot,
                      void *const *g, void *const *sum, int grad_bf16, double lr, double lr_decay,
                      double weight_decay, double eps, int maximize, int64_t step, int nt)
{
    Job job;
    if (job_init(&job, t, n, p, bot, g, sum, NULL, NULL, grad_bf16, 0))
        return -1;
    const Adagrad h = {SET(lr / (1.0 + (double)(step - 1) * lr_decay)), SET(weight_decay),
                       SET(eps), weight_decay != 0.0, maximize};
#define CALL(s, b) SPAN(adagrad_vec, &h, &q, lo, hi, s, b, 1, 1)
    PARALLEL(nt) CHUNKS(&job, CALL)
#undef CALL
    free(job.start);
    return 0;
}

/* ---- adam / adamw: m, v (amsgrad: vmax = max(vmax, v)); p = p decay - (lr/bc1) m / den,
 * den = sqrt(v) / sqrt(bc2) + eps; decay = 1 - lr wd (adamw) or 1, adam adds wd p to g ---- */
typedef struct {
    V ss, sbc2, eps, wd, decay, b1, omb1, b2, omb2;
    int l2, maximize, ams;
} Adam;

RC_INLINE V moment(V b, V s, V omb_x, V x) /* b s + (1 - b) x, omb_x x = ((1 - b) x) x */
{
    return _mm256_fmadd_ps(b, s, _mm256_mul_ps(omb_x, x));
}

RC_INLINE void adam_vec(const Adam *h, const Bufs *q, int64_t i, int split, int gbf16)
{
    V p = ld_p(q, i, split), d = LD_G(q, i, gbf16);
    if (h->maximize)
        d = NEG(d);
    if (h->l2)
        d = _mm256_fmadd_ps(h->wd, p, d);
    V m = moment(h->b1, LD_S(q, 0, i), h->omb1, d);
    V v = moment(h->b2, LD_S(q, 1, i), _mm256_mul_ps(h->omb2, d), d);
    ST_S(q, 0, i, m);
    ST_S(q, 1, i, v);
    if (h->ams) { /* np.maximum: NaN if either is NaN (max_ps returns v when either is) */
        V o = LD_S(q, 2, i);
        v = _mm256_blendv_ps(_mm256_max_ps(o, v), o, _mm256_cmp_ps(o, o, _CMP_UNORD_Q));
        ST_S(q, 2, i, v);
    }
    V den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), h->sbc2), h->eps);
    V u = _mm256_div_ps(_mm256_mul_ps(h->ss, m), den);
    st_p(q, i, _mm256_fmsub_ps(p, h->decay, u), split);
}

static int adam_run(int decoupled, int64_t t, const int64_t *n, void *const *p, void *const *bot,
                    void *const *g, void *const *m, void *const *v, void *const *vmax,
                    int grad_bf16, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int maximize, int64_t step, int nt)
{
    Job job;
    if (job_init(&job, t, n, p, bot, g, m, v, vmax, grad_bf16, 0))
        return -1;
    const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
    const Adam h = {SET(lr / bc1),      SET(sqrt(bc2)),
                    SET(eps),           SET(weight_decay),
                    SET(decoupled ? 1.0 - lr * weight_decay : 1.0),
                    SET(beta1),         SET(1.0 - beta1),
                    SET(beta2),         SET(1.0 - beta2),
                    !decoupled && weight_decay != 0.0, maximize, vmax != NULL};
#define CALL(s, b) SPAN(adam_vec, &h, &q, lo, hi, s, b, 1, 1)
    PARALLEL(nt) CHUNKS(&job, CALL)
#undef CALL
    free(job.start);
    return 0;
}

#define ADAM(name, decoupled)                                                                      \
    int RC_FN(name)(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g, \
                    void *const *exp_avg, void *const *exp_avg_sq, void *const *max_exp_avg_sq,   \
                    int grad_bf16, double lr, double beta1, double beta2, double eps,              \
                    double weight_decay, int maximize, int64_t step, int nt)                       \
    {                                                                                              \
        return adam_run(decoupled, t, n, p, bot, g, exp_avg, exp_avg_sq, max_exp_avg_sq,           \
                        grad_bf16, lr, beta1, beta2, eps, weight_decay, maximize, step, nt);       \
    }
ADAM(rc_adam, 0)
ADAM(rc_adamw, 1)

/* ---- lamb: m, v as adam; u = (m / bc1) / (sqrt(v / bc2) + eps) + wd p; p -= lr r u ---- */
typedef struct {
    V bc1, bc2, eps, wd, b1, omb1, b2, omb2, f; /* f: lr * ratio of the tensor (pass 2) */
} Lamb;

RC_INLINE V lamb_u(const Lamb *h, V p, V m, V v)
{
    V r = _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(v, h->bc2)), h->eps);
    return _mm256_fmadd_ps(h->wd, p, _mm256_div_ps(_mm256_div_ps(m, h->bc1), r));
}

RC_INLINE void sq_acc(__m256d *a, V x) /* a[0..1] += x^2 in double, lane-wise */
{
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    a[0] = _mm256_fmadd_pd(lo, lo, a[0]);
    a[1] = _mm256_fmadd_pd(hi, hi, a[1]);
}

/* pass 1 on one vector; in a tail (keep: the real lanes) the padding adds nothing to the sums */
RC_INLINE void lamb_vec1(const Lamb *h, const Bufs *q, int64_t i, int split, int gbf16,
                         __m256d *acc, int tail, V keep)
{
    V p = ld_p(q, i, split), d = LD_G(q, i, gbf16);
    V m = moment(h->b1, LD_S(q, 0, i), h->omb1, d);
    V v = moment(h->b2, LD_S(q, 1, i), _mm256_mul_ps(h->omb2, d), d);
    ST_S(q, 0, i, m);
    ST_S(q, 1, i, v);
    V u = lamb_u(h, p, m, v);
    sq_acc(acc, tail ? _mm256_and_ps(p, keep) : p);
    sq_acc(acc + 2, tail ? _mm256_and_ps(u, keep) : u);
}

RC_INLINE void lamb_span1(const Lamb *h, const Bufs *q, int64_t lo, int64_t hi, int split,
                          int gbf16, double *out)
{
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                      _mm256_setzero_pd()};
    int64_t i = lo;
    for (; i + VL <= hi; i += VL)
        lamb_vec1(h, q, i, split, gbf16, acc, 0, _mm256_setzero_ps());
    if (i < hi) {
        Pad d;
        Bufs t;
        pad_in(&d, &t, q, i, hi - i, split, gbf16);
        lamb_vec1(h, &t, 0, split, gbf16, acc, 1, _mm256_castsi256_ps(rc8_lanes(hi - i)));
        pad_out(&d, q, i, hi - i, split, 0, 1);
    }
    for (int x = 0; x < 2; x++) {
        double l[4];
        _mm256_storeu_pd(l, _mm256_add_pd(acc[2 * x], acc[2 * x + 1]));
        out[x] = (l[0] + l[1]) + (l[2] + l[3]);
    }
}

RC_INLINE void lamb_vec2(const Lamb *h, const Bufs *q, int64_t i, int split, int gbf16)
{
    (void)gbf16;
    V p = ld_p(q, i, split);
    st_p(q, i, _mm256_fnmadd_ps(h->f, lamb_u(h, p, LD_S(q, 0, i), LD_S(q, 1, i)), p), split);
}

int RC_FN(rc_lamb)(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                   void *const *exp_avg, void *const *exp_avg_sq, int grad_bf16, double lr,
                   double beta1, double beta2, double eps, double weight_decay, double clamp_min,
                   double clamp_max, int64_t step, int nt)
{
    Job job;
    if (job_init(&job, t, n, p, bot, g, exp_avg, exp_avg_sq, NULL, grad_bf16, 1))
        return -1;
    double *sums = (double *)(job.start + t + 1); /* (p^2, u^2) per chunk */
    float *fac = (float *)(sums + 2 * job.chunks); /* lr * ratio per tensor */
    const Lamb h = {SET(1.0 - pow(beta1, (double)step)), SET(1.0 - pow(beta2, (double)step)),
                    SET(eps), SET(weight_decay), SET(beta1), SET(1.0 - beta1), SET(beta2),
                    SET(1.0 - beta2), SET(0.0)};
    PARALLEL(nt)
    {
#define CALL(s, b) lamb_span1(&h, &q, lo, hi, s, b, sums + 2 * c)
        CHUNKS(&job, CALL)
#undef CALL
        RC_PRAGMA(omp single)
        for (int64_t k = 0; k < t; k++) {
            double sp = 0.0, su = 0.0;
            for (int64_t c = job.start[k]; c < job.start[k + 1]; c++) {
                sp += sums[2 * c];
                su += sums[2 * c + 1];
            }
            double wn = sqrt(sp), un = sqrt(su), r = 1.0, w = wn;
            if (wn != 0.0 && un != 0.0) { /* NaN norms give NaN, as the reference */
                w = clamp_min > w ? clamp_min : w;
                w = clamp_max < w ? clamp_max : w;
                r = w / un;
            }
            fac[k] = (float)(lr * r);
        }
#define CALL(s, b)                                                                                 \
    do {                                                                                           \
        Lamb hk = h;                                                                               \
        hk.f = _mm256_set1_ps(fac[k]);                                                             \
        SPAN(lamb_vec2, &hk, &q, lo, hi, s, b, 1, 0);                                              \
    } while (0)
        CHUNKS(&job, CALL)
#undef CALL
    }
    free(job.start);
    return 0;
}
