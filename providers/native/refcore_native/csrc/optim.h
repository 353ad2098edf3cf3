/* optim family (specs/optim.yaml): fused multi-tensor optimizer steps, one pass over param /
 * grad / state (lamb: two), in place. The rules are refcore/ops/optim.py's.
 *
 * One call steps t tensors; tensor k has n[k] >= 0 elements and these C-contiguous buffers:
 *   p[k]     the master: float32, or (bot != NULL) the bf16 top halves as uint16 bits
 *   bot      NULL for float32 masters, else bot[k] = the uint16 bottom halves (split_bf16: the
 *            master is the float32 whose bits are p << 16 | bot; stored back truncated: p = bits
 *            >> 16, bot = bits & 0xFFFF)
 *   g[k]     the grad: float32, or bfloat16 bits when grad_bf16 (read only)
 *   state    float32 arrays (named as torch's state); optional ones NULL when absent
 * Hyper-parameters are passed as the spec gives them (double); the per-call factors (bias
 * corrections, lr / bc1, ...) are formed once in double, then used as float.
 * step: the 1-based step number (bias corrections, adagrad's lr decay). nt: threads (1 = serial,
 * 0 = OpenMP default). Return 0, or -1 when a scratch table could not be allocated (nothing was
 * written then).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_OPTIM_H
#define RC_OPTIM_H
#include <stdint.h>

int rc_sgd_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                    void *const *momentum_buffer, int grad_bf16, double lr, double momentum,
                    double dampening, double weight_decay, int nesterov, int maximize, int fresh,
                    int nt);
int rc_adagrad_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot,
                        void *const *g, void *const *sum, int grad_bf16, double lr, double lr_decay,
                        double weight_decay, double eps, int maximize, int64_t step, int nt);
int rc_adam_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                     void *const *exp_avg, void *const *exp_avg_sq, void *const *max_exp_avg_sq,
                     int grad_bf16, double lr, double beta1, double beta2, double eps,
                     double weight_decay, int maximize, int64_t step, int nt);
int rc_adamw_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                      void *const *exp_avg, void *const *exp_avg_sq, void *const *max_exp_avg_sq,
                      int grad_bf16, double lr, double beta1, double beta2, double eps,
                      double weight_decay, int maximize, int64_t step, int nt);
int rc_lamb_portable(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                     void *const *exp_avg, void *const *exp_avg_sq, int grad_bf16, double lr,
                     double beta1, double beta2, double eps, double weight_decay, double clamp_min,
                     double clamp_max, int64_t step, int nt);

int rc_sgd_avx2(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                void *const *momentum_buffer, int grad_bf16, double lr, double momentum,
                double dampening, double weight_decay, int nesterov, int maximize, int fresh,
                int nt);
int rc_adagrad_avx2(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                    void *const *sum, int grad_bf16, double lr, double lr_decay,
                    double weight_decay, double eps, int maximize, int64_t step, int nt);
int rc_adam_avx2(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                 void *const *exp_avg, void *const *exp_avg_sq, void *const *max_exp_avg_sq,
                 int grad_bf16, double lr, double beta1, double beta2, double eps,
                 double weight_decay, int maximize, int64_t step, int nt);
int rc_adamw_avx2(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                  void *const *exp_avg, void *const *exp_avg_sq, void *const *max_exp_avg_sq,
                  int grad_bf16, double lr, double beta1, double beta2, double eps,
                  double weight_decay, int maximize, int64_t step, int nt);
int rc_lamb_avx2(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                 void *const *exp_avg, void *const *exp_avg_sq, int grad_bf16, double lr,
                 double beta1, double beta2, double eps, double weight_decay, double clamp_min,
                 double clamp_max, int64_t step, int nt);

int rc_sgd_avx512(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                  void *const *momentum_buffer, int grad_bf16, double lr, double momentum,
                  double dampening, double weight_decay, int nesterov, int maximize, int fresh,
                  int nt);
int rc_adagrad_avx512(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                      void *const *sum, int grad_bf16, double lr, double lr_decay,
                      double weight_decay, double eps, int maximize, int64_t step, int nt);
int rc_adam_avx512(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                   void *const *exp_avg, void *const *exp_avg_sq, void *const *max_exp_avg_sq,
                   int grad_bf16, double lr, double beta1, double beta2, double eps,
                   double weight_decay, int maximize, int64_t step, int nt);
int rc_adamw_avx512(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                    void *const *exp_avg, void *const *exp_avg_sq, void *const *max_exp_avg_sq,
                    int grad_bf16, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int maximize, int64_t step, int nt);
int rc_lamb_avx512(int64_t t, const int64_t *n, void *const *p, void *const *bot, void *const *g,
                   void *const *exp_avg, void *const *exp_avg_sq, int grad_bf16, double lr,
                   double beta1, double beta2, double eps, double weight_decay, double clamp_min,
                   double clamp_max, int64_t step, int nt);

#endif
