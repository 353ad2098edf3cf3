/* optim family, portable C: fused multi-tensor steps of sgd, adagrad, adam, adamw, lamb.
 *
 * The structure of optim_avx2.c with one element at a time: the elements of all t tensors in
 * chunks of CHUNK numbered across the tensors, handed out dynamically by one parallel region per
 * call (a chunk finds its tensor by binary search in a prefix table).
 *
 * Arithmetic: float32 in the reference's order, each stored state re-read as stored. Where
 * optim_avx2.c has a fused multiply-add this file has fma1: the product of two floats is exact
 * in double, so one double add and the float conversion round as an fma does (but for a rare
 * double-rounding tie); the file is built without -mfma, so the compiler contracts nothing. The
 * split_bf16 master is joined to its float32 bits at the load and split (truncated) at the store
 * and otherwise runs the code of the float32 master (the flags are constants per chunk), so both
 * give the same bits. amsgrad's max keeps a NaN of either operand, as np.maximum.
 *
 * lamb: pass 1 updates m, v and sums p^2 and u^2 per chunk in double; one thread forms each
 * tensor's trust ratio from its chunks' sums in chunk order (no dependence on the thread count);
 * pass 2 recomputes u from the stored m, v and writes p - lr * ratio * u.
 */
#include <stdlib.h>

#include "optim.h"
#include "rc_common.h"

#define RC_INLINE static inline __attribute__((always_inline))

#include "rc_optim_job.h"

/* The master at element i: float32, or the split pair joined (top << 16 | bottom). */
RC_INLINE float ld_p(const Bufs *q, int64_t i, int split)
{
    if (!split)
        return ((const float *)q->p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)q->p)[i] << 16 | q->b[i];
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Store the master: float32, or split (top = bits >> 16, bottom = bits & 0xFFFF). */
RC_INLINE void st_p(const Bufs *q, int64_t i, float x, int split)
{
    if (!split) {
        ((float *)q->p)[i] = x;
        return;
    }
    uint32_t u;
    memcpy(&u, &x, 4);
    ((uint16_t *)q->p)[i] = (uint16_t)(u >> 16);
    q->b[i] = (uint16_t)(u & 0xFFFFu);
}

/* a * b + c rounded once (to float, through double: see the top of the file) */
RC_INLINE float fma1(float a, float b, float c)
{
    return (float)((double)a * b + c);
}

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
    float lr, wd, mom, damp1;
    int wd_on, mom_on, nesterov, maximize, fresh;
} Sgd;

RC_INLINE void sgd_span(const Sgd *h, const Bufs *q, int64_t lo, int64_t hi, int split, int gbf16)
{
    for (int64_t i = lo; i < hi; i++) {
        float p = ld_p(q, i, split), d = rc_ld(q->g, i, gbf16);
        if (h->maximize)
            d = -d;
        if (h->wd_on)
            d = fma1(h->wd, p, d);
        if (h->mom_on) {
            float b = h->fresh ? d : fma1(h->mom, q->s[0][i], h->damp1 * d);
            q->s[0][i] = b;
            d = h->nesterov ? fma1(h->mom, b, d) : b;
        }
        st_p(q, i, fma1(-h->lr, d, p), split);
    }
}

int rc_sgd_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                    void *const *momentum_buffer, int grad_bf16, double lr, double momentum,
                    double dampening, double weight_decay, int nesterov, int maximize, int fresh,
                    int nt)
{
    Job job;
    void *const *buf = momentum != 0.0 ? momentum_buffer : NULL;
    if (job_init(&job, t, n, p, bot, g, buf, NULL, NULL, grad_bf16, 0))
        return -1;
    const Sgd h = {(float)lr,      (float)weight_decay, (float)momentum, (float)(1.0 - dampening),
                   weight_decay != 0.0, momentum != 0.0, nesterov,        maximize,
                   fresh};
#define CALL(s, b) sgd_span(&h, &q, lo, hi, s, b)
    PARALLEL(nt) CHUNKS(&job, CALL)
#undef CALL
    free(job.start);
    return 0;
}

/* ---- adagrad: g = +-g (+ wd p); sum += g^2; p -= clr g / (sqrt(sum) + eps) ---- */
typedef struct {
    float clr, wd, eps;
    int wd_on, maximize;
} Adagrad;

RC_INLINE void adagrad_span(const Adagrad *h, const Bufs *q, int64_t lo, int64_t hi, int split,
                            int gbf16)
{
    for (int64_t i = lo; i < hi; i++) {
        float p = ld_p(q, i, split), d = rc_ld(q->g, i, gbf16);
        if (h->maximize)
            d = -d;
        if (h->wd_on)
            d = fma1(h->wd, p, d);
        float s = fma1(d, d, q->s[0][i]);
        q->s[0][i] = s;
        st_p(q, i, p - h->clr * d / (sqrtf(s) + h->eps), split);
    }
}

int rc_adagrad_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot,
                        void *const *g, void *const *sum, int grad_bf16, double lr,
                        double lr_decay, double weight_decay, double eps, int maximize,
                        int64_t step, int nt)
{
    Job job;
    if (job_init(&job, t, n, p, bot, g, sum, NULL, NULL, grad_bf16, 0))
        return -1;
    const double clr = lr / (1.0 + (double)(step - 1) * lr_decay);
    const Adagrad h = {(float)clr, (float)weight_decay, (float)eps, weight_decay != 0.0, maximize};
#define CALL(s, b) adagrad_span(&h, &q, lo, hi, s, b)
    PARALLEL(nt) CHUNKS(&job, CALL)
#undef CALL
    free(job.start);
    return 0;
}

/* ---- adam / adamw: m, v (amsgrad: vmax = max(vmax, v)); p = p decay - (lr/bc1) m / den,
 * den = sqrt(v) / sqrt(bc2) + eps; decay = 1 - lr wd (adamw) or 1, adam adds wd p to g ---- */
typedef struct {
    float ss, sbc2, eps, wd, decay, b1, omb1, b2, omb2;
    int l2, maximize, ams;
} Adam;

RC_INLINE void adam_span(const Adam *h, const Bufs *q, int64_t lo, int64_t hi, int split,
                         int gbf16)
{
    for (int64_t i = lo; i < hi; i++) {
        float p = ld_p(q, i, split), d = rc_ld(q->g, i, gbf16);
        if (h->maximize)
            d = -d;
        if (h->l2)
            d = fma1(h->wd, p, d);
        float m = fma1(h->b1, q->s[0][i], h->omb1 * d);
        float v = fma1(h->b2, q->s[1][i], h->omb2 * d * d);
        q->s[0][i] = m;
        q->s[1][i] = v;
        if (h->ams) { /* np.maximum: NaN if either is NaN */
            float o = q->s[2][i];
            v = o != o ? o : v != v ? v : o > v ? o : v;
            q->s[2][i] = v;
        }
        float den = sqrtf(v) / h->sbc2 + h->eps;
        st_p(q, i, fma1(p, h->decay, -(h->ss * m / den)), split);
    }
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
    const double decay = decoupled ? 1.0 - lr * weight_decay : 1.0;
    const Adam h = {(float)(lr / bc1),    (float)sqrt(bc2),     (float)eps,
                    (float)weight_decay,  (float)decay,         (float)beta1,
                    (float)(1.0 - beta1), (float)beta2,         (float)(1.0 - beta2),
                    !decoupled && weight_decay != 0.0, maximize, vmax != NULL};
#define CALL(s, b) adam_span(&h, &q, lo, hi, s, b)
    PARALLEL(nt) CHUNKS(&job, CALL)
#undef CALL
    free(job.start);
    return 0;
}

int rc_adam_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot,
                     void *const *g, void *const *exp_avg, void *const *exp_avg_sq,
                     void *const *max_exp_avg_sq, int grad_bf16, double lr, double beta1,
                     double beta2, double eps, double weight_decay, int maximize, int64_t step,
                     int nt)
{
    return adam_run(0, t, n, p, bot, g, exp_avg, exp_avg_sq, max_exp_avg_sq, grad_bf16, lr, beta1,
                    beta2, eps, weight_decay, maximize, step, nt);
}

int rc_adamw_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot,
                      void *const *g, void *const *exp_avg, void *const *exp_avg_sq,
                      void *const *max_exp_avg_sq, int grad_bf16, double lr, double beta1,
                      double beta2, double eps, double weight_decay, int maximize, int64_t step,
                      int nt)
{
    return adam_run(1, t, n, p, bot, g, exp_avg, exp_avg_sq, max_exp_avg_sq, grad_bf16, lr, beta1,
                    beta2, eps, weight_decay, maximize, step, nt);
}

/* ---- lamb: m, v as adam; u = (m / bc1) / (sqrt(v / bc2) + eps) + wd p; p -= lr r u ---- */
typedef struct {
    float bc1, bc2, eps, wd, b1, omb1, b2, omb2;
} Lamb;

RC_INLINE float lamb_u(const Lamb *h, float p, float m, float v)
{
    return fma1(h->wd, p, m / h->bc1 / (sqrtf(v / h->bc2) + h->eps));
}

RC_INLINE void lamb_span1(const Lamb *h, const Bufs *q, int64_t lo, int64_t hi, int split,
                          int gbf16, double *out)
{
    double sp = 0.0, su = 0.0;
    for (int64_t i = lo; i < hi; i++) {
        float p = ld_p(q, i, split), d = rc_ld(q->g, i, gbf16);
        float m = fma1(h->b1, q->s[0][i], h->omb1 * d);
        float v = fma1(h->b2, q->s[1][i], h->omb2 * d * d);
        q->s[0][i] = m;
        q->s[1][i] = v;
        double u = lamb_u(h, p, m, v);
        sp += (double)p * p;
        su += u * u;
    }
    out[0] = sp;
    out[1] = su;
}

RC_INLINE void lamb_span2(const Lamb *h, const Bufs *q, int64_t lo, int64_t hi, int split,
                          float f)
{
    for (int64_t i = lo; i < hi; i++) {
        float p = ld_p(q, i, split);
        st_p(q, i, fma1(-f, lamb_u(h, p, q->s[0][i], q->s[1][i]), p), split);
    }
}

int rc_lamb_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot,
                     void *const *g, void *const *exp_avg, void *const *exp_avg_sq, int grad_bf16,
                     double lr, double beta1, double beta2, double eps, double weight_decay,
                     double clamp_min, double clamp_max, int64_t step, int nt)
{
    Job job;
    if (job_init(&job, t, n, p, bot, g, exp_avg, exp_avg_sq, NULL, grad_bf16, 1))
        return -1;
    double *sums = (double *)(job.start + t + 1); /* (p^2, u^2) per chunk */
    float *fac = (float *)(sums + 2 * job.chunks); /* lr * ratio per tensor */
    const Lamb h = {(float)(1.0 - pow(beta1, (double)step)),
                    (float)(1.0 - pow(beta2, (double)step)),
                    (float)eps,
                    (float)weight_decay,
                    (float)beta1,
                    (float)(1.0 - beta1),
                    (float)beta2,
                    (float)(1.0 - beta2)};
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
#define CALL(s, b) lamb_span2(&h, &q, lo, hi, s, fac[k])
        CHUNKS(&job, CALL)
#undef CALL
    }
    free(job.start);
    return 0;
}
