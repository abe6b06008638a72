/* Row-invariant kernels for minigpt's "w4a8" path (minigpt/kernels/__init__.py builds and loads them): a product of
   4-bit weights and 8-bit activations (minigpt/quant.py's W4A8Linear lays the weights out and calls it), and
   attention one query row at a time (at the end of this file).

       y[r, n] = sum over groups g, in order, of   step[n, g] * dx[r, g] * dot(r, n, g)  +  lo[n, g] * xs[r, g]

   Weights: 4-bit integers q in 0..15 with a step and a minimum per group of 32 inputs (the layout of a GGUF file's
   Q4_1 blocks), a weight being q * step + lo. Activations: each group of 32 inputs of a row rounded to int8 with a
   scale dx of its own (its largest magnitude / 127: llama.cpp's Q8 blocks); dot(r, n, g) is the group's 32 products
   of int8 activations and 4-bit weights summed in int32, and xs[r, g] = dx[r, g] * (sum of the group's int8 values),
   so the minimum's share is one product.

   Why a row's result cannot depend on how many rows share the call: a group's products are summed in int32, which
   is exact, so in whatever order and in however many partial sums; the groups' scaled sums are then added in fp32
   in one fixed order (g = 0, 1, ...: a multiply, a fused multiply-add for the step's share and one for the
   minimum's), the same operations for every row whatever the number of rows. What the rows share is the unpacking
   of each block of weights, which is why a pass over several tokens costs less than that many one-token passes.

   Layout: outputs in blocks of 16 (the 16 fp32 lanes of a 512-bit register, one output per lane). For block b,
   group g and quad j (inputs 4j .. 4j + 3 of the group), 32 bytes: byte 4i + t holds the weight of output i, input
   4j + t in its low 4 bits and that of output 8 + i in its high 4 bits. Unpacked, that is one 64-byte register
   whose lane i holds output i's four weights: one vpdpbusd against the quad of activations, broadcast, adds the
   quad's four products into each output's lane. step and lo are laid out (block, group, 16).

   The vector path needs AVX-512 VNNI; elsewhere a plain C loop computes the same formula in the same order. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define W4A8_VNNI 1
#else
#define W4A8_VNNI 0
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define LANES 16
#define QUADS 8            /* quads of 4 inputs in a group of 32 */
#define ROWS_AT_ONCE 4

int w4a8_vector_path(void) { return W4A8_VNNI; }

/* Each group of 32 inputs of each row of x (rows, K) rounded to int8 with a scale of its own: xq (rows, K),
   dx (rows, K / 32), xs = dx * (sum of the group's int8 values). Element by element, with exact sums: a row's
   numbers depend on that row alone. */
static void quantize_rows(int rows, int K, const float *x, int8_t *xq, float *dx, float *xs) {
    const int G = K / 32;
    for (int r = 0; r < rows; r++) {
        for (int g = 0; g < G; g++) {
            const float *v = x + (int64_t)r * K + 32 * g;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                float a = fabsf(v[i]);
                amax = a > amax ? a : amax;
            }
            float s = amax / 127.0f;
            if (s < 1e-30f) s = 1e-30f;
            int32_t sum = 0;
            int8_t *out = xq + (int64_t)r * K + 32 * g;
            for (int i = 0; i < 32; i++) {
                out[i] = (int8_t)rintf(v[i] / s);      /* |v / s| <= 127; halves to even, as torch.round */
                sum += out[i];
            }
            dx[(int64_t)r * G + g] = s;
            xs[(int64_t)r * G + g] = (float)sum * s;
        }
    }
}

#if W4A8_VNNI
/* The 64-byte register of 4-bit weights for block quad ``w`` (32 packed bytes), one output's quad per 32-bit lane. */
static inline __m512i unpack(const uint8_t *w) {
    __m256i packed = _mm256_loadu_si256((const __m256i *)w), mask = _mm256_set1_epi8(0x0F);
    __m512i low = _mm512_castsi256_si512(_mm256_and_si256(packed, mask));
    return _mm512_inserti64x4(low, _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask), 1);
}

/* The float part of a group, the same for every row: acc += dot * (step * dx) ; acc += lo * xs. */
static inline __m512 add_group(__m512 acc, __m512i dot, __m512 step, __m512 lo, float dx, float xs) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(step, _mm512_set1_ps(dx)), acc);
    return _mm512_fmadd_ps(lo, _mm512_set1_ps(xs), acc);
}

static inline __m512i quad(const int8_t *x) {   /* four activations, broadcast to every lane */
    int32_t four;
    memcpy(&four, x, 4);
    return _mm512_set1_epi32(four);
}

/* Weight register i of a block: from ``ub`` where the block was unpacked once for several rows, else unpacked now. */
static inline __m512i weights(const uint8_t *wb, const uint8_t *ub, int i) {
    return ub ? _mm512_loadu_si512(ub + 64 * i) : unpack(wb + 32 * i);
}

/* One row (its int8 activations ``x``, group scales ``dx``, ``xs``) against one block of 16 outputs, into y. */
static void one_row(int G, const uint8_t *wb, const uint8_t *ub, const float *st, const float *lo, const int8_t *x,
                    const float *dx, const float *xs, float *y, __mmask16 store) {
    __m512 acc = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
        for (int j = 0; j < QUADS; j += 2) {
            d0 = _mm512_dpbusd_epi32(d0, weights(wb, ub, g * QUADS + j), quad(x + 32 * g + 4 * j));
            d1 = _mm512_dpbusd_epi32(d1, weights(wb, ub, g * QUADS + j + 1), quad(x + 32 * g + 4 * j + 4));
        }
        acc = add_group(acc, _mm512_add_epi32(d0, d1), _mm512_loadu_ps(st + LANES * g),
                        _mm512_loadu_ps(lo + LANES * g), dx[g], xs[g]);
    }
    _mm512_mask_storeu_ps(y, store, acc);
}

/* One block of 16 outputs for all rows. ``wb``: the block's packed weights; ``ub``: room for them unpacked. */
static void block(int rows, int K, int n_valid, const uint8_t *wb, const float *st, const float *lo,
                  const int8_t *xq, const float *dx, const float *xs, float *y, int N, uint8_t *ub) {
    const int G = K / 32;
    const __mmask16 store = n_valid >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << n_valid) - 1);
    if (rows == 1) {                       /* a one-token step: unpack as it goes, nothing to share */
        one_row(G, wb, NULL, st, lo, xq, dx, xs, y, store);
        return;
    }
    for (int i = 0; i < G * QUADS; i++)
        _mm512_storeu_si512(ub + 64 * i, unpack(wb + 32 * i));
    int r = 0;
    for (; r + ROWS_AT_ONCE <= rows; r += ROWS_AT_ONCE) {
        __m512 acc[ROWS_AT_ONCE];
        for (int i = 0; i < ROWS_AT_ONCE; i++) acc[i] = _mm512_setzero_ps();
        for (int g = 0; g < G; g++) {
            __m512i dot[ROWS_AT_ONCE];
            for (int i = 0; i < ROWS_AT_ONCE; i++) dot[i] = _mm512_setzero_si512();
            for (int j = 0; j < QUADS; j++) {
                __m512i w = _mm512_loadu_si512(ub + 64 * (g * QUADS + j));
                for (int i = 0; i < ROWS_AT_ONCE; i++)
                    dot[i] = _mm512_dpbusd_epi32(dot[i], w, quad(xq + (int64_t)(r + i) * K + 32 * g + 4 * j));
            }
            __m512 s = _mm512_loadu_ps(st + LANES * g), l = _mm512_loadu_ps(lo + LANES * g);
            for (int i = 0; i < ROWS_AT_ONCE; i++)
                acc[i] = add_group(acc[i], dot[i], s, l, dx[(int64_t)(r + i) * G + g], xs[(int64_t)(r + i) * G + g]);
        }
        for (int i = 0; i < ROWS_AT_ONCE; i++)
            _mm512_mask_storeu_ps(y + (int64_t)(r + i) * N, store, acc[i]);
    }
    for (; r < rows; r++)
        one_row(G, wb, ub, st, lo, xq + (int64_t)r * K, dx + (int64_t)r * G, xs + (int64_t)r * G,
                y + (int64_t)r * N, store);
}
#else
static void block(int rows, int K, int n_valid, const uint8_t *wb, const float *st, const float *lo,
                  const int8_t *xq, const float *dx, const float *xs, float *y, int N, uint8_t *ub) {
    const int G = K / 32;
    (void)ub;
    for (int r = 0; r < rows; r++) {
        float acc[LANES] = {0};
        for (int g = 0; g < G; g++) {
            int32_t dot[LANES] = {0};
            for (int j = 0; j < QUADS; j++) {
                const uint8_t *w = wb + (g * QUADS + j) * 32;
                const int8_t *x = xq + (int64_t)r * K + 32 * g + 4 * j;
                for (int i = 0; i < 8; i++)
                    for (int t = 0; t < 4; t++) {
                        dot[i] += (int32_t)(w[4 * i + t] & 0x0F) * x[t];
                        dot[8 + i] += (int32_t)(w[4 * i + t] >> 4) * x[t];
                    }
            }
            const float d = dx[(int64_t)r * G + g], s = xs[(int64_t)r * G + g];
            for (int i = 0; i < LANES; i++) {
                acc[i] = fmaf((float)dot[i], st[LANES * g + i] * d, acc[i]);
                acc[i] = fmaf(lo[LANES * g + i], s, acc[i]);
            }
        }
        for (int i = 0; i < n_valid && i < LANES; i++)
            y[(int64_t)r * N + i] = acc[i];
    }
}
#endif

/* y (rows, N) = x (rows, K) times the weights (``wq``: (ceil(N / 16), K / 32, 8, 32) bytes; ``step``, ``lo``:
   (ceil(N / 16), K / 32, 16) fp32) by the formula above. Returns 0; -1 if K is not a positive multiple of 32; -2 if
   out of memory. ``threads`` > 1 splits the blocks of outputs among OpenMP threads (where built with OpenMP): each
   (row, output) is still computed by one thread, in one order. */
int w4a8_linear(int rows, int N, int K, const float *x, const uint8_t *wq, const float *step, const float *lo,
                float *y, int threads) {
    if (K <= 0 || K % 32)
        return -1;
    const int G = K / 32, blocks = (N + LANES - 1) / LANES;
    const int teams = threads > 0 ? threads : 1;
    int8_t *xq = malloc((size_t)rows * K);
    float *dx = malloc(sizeof(float) * (size_t)rows * G), *xs = malloc(sizeof(float) * (size_t)rows * G);
    uint8_t *ub = rows > 1 ? malloc((size_t)teams * G * QUADS * 64) : NULL;   /* each thread's unpacked block */
    int failed = !xq || !dx || !xs || (rows > 1 && !ub);
    if (!failed) {
        quantize_rows(rows, K, x, xq, dx, xs);
#ifdef _OPENMP
#pragma omp parallel for num_threads(teams) schedule(static)
#endif
        for (int b = 0; b < blocks; b++) {
            int team = 0;
#ifdef _OPENMP
            team = omp_get_thread_num();
#endif
            block(rows, K, N - b * LANES, wq + (int64_t)b * G * QUADS * 32, step + (int64_t)b * G * LANES,
                  lo + (int64_t)b * G * LANES, xq, dx, xs, y + (int64_t)b * LANES, N,
                  ub ? ub + (size_t)team * G * QUADS * 64 : NULL);
        }
    }
    free(ub);
    free(xq); free(dx); free(xs);
    return failed ? -2 : 0;
}

/* ---------------------------------------------------------------------------------------------------------------
   Attention, one query row at a time, in an order that depends on that row alone (minigpt.precision's
   InvariantAttention with its compiled road).

   For each sequence b, query row t and head h (key head h / (n_head / n_kv)): the row's keys are the cache slots
   0 .. n[t] - 1, or, where ofs[t] >= 0, the n[t] slots idx[ofs[t]] ... (a token tree's node: its ancestors and
   itself, in order). scores s_j = (q . k_j) * scale, each dot product summed in 16 partial sums over the head's
   numbers, then those in order; softmax with the row's own maximum, the exponentials summed key by key in order;
   out = (sum_j p_j v_j) / (sum_j p_j), the weighted values added key by key in order. Nothing here depends on the
   number of rows or on the other rows, so a k-token pass gives each row the bits of a one-token step.

   exp: our own, exp(x) = 2^i * p(f) with x log2(e) = i + f, f in [-0.5, 0.5], p a degree-6 polynomial (relative
   error below 2e-7 on the range softmax uses, x <= 0): plain arithmetic, so the compiler can run it 16 at a time,
   and the same bits wherever it runs. */

static inline float exp_neg(float x) {
    if (x < -87.0f) return 0.0f;
    float t = x * 1.44269504088896341f;
    float i = rintf(t), f = t - i;
    /* 2^f on [-0.5, 0.5]: Taylor coefficients of e^(f ln 2) */
    float p = 1.54035304e-4f;
    p = p * f + 1.33335581e-3f;
    p = p * f + 9.61812911e-3f;
    p = p * f + 5.55041087e-2f;
    p = p * f + 2.40226507e-1f;
    p = p * f + 6.93147181e-1f;
    p = p * f + 1.0f;
    union { float f; int32_t i; } u = { p };
    u.i += (int32_t)i << 23;
    return u.f;
}

#define MAX_KEYS 65536
#define MAX_HS 256

#if W4A8_VNNI
static inline __m512 exp_neg16(__m512 x) {      /* exp_neg, 16 at a time, the same formula */
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 i = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(t, i);
    __m512 p = _mm512_set1_ps(1.54035304e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.33335581e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.61812911e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.55041087e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.40226507e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.93147181e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    __m512 e = _mm512_scalef_ps(p, i);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ), e, _mm512_setzero_ps());
}
#endif

/* One query row of one head against its L keys (slots 0 .. L - 1, or ``slots``): the attention output into o. */
static void softmax_row(const float *qr, const float *kb, const float *vb, int hs, int L, const int32_t *slots,
                        float scale, float *s, float *o) {
    float best = -INFINITY;
#if W4A8_VNNI
    for (int j = 0; j < L; j++) {
        const float *kr = kb + (int64_t)(slots ? slots[j] : j) * hs;
        __m512 part = _mm512_mul_ps(_mm512_loadu_ps(qr), _mm512_loadu_ps(kr));
        for (int d = 16; d < hs; d += 16)
            part = _mm512_fmadd_ps(_mm512_loadu_ps(qr + d), _mm512_loadu_ps(kr + d), part);
        s[j] = _mm512_reduce_add_ps(part) * scale;
        best = s[j] > best ? s[j] : best;
    }
    __m512 top = _mm512_set1_ps(best), sum = _mm512_setzero_ps();
    for (int j = 0; j < L; j += 16) {
        __mmask16 m = L - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (L - j)) - 1);
        __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), top));
        _mm512_mask_storeu_ps(s + j, m, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
    }
    const float total = _mm512_reduce_add_ps(sum);
    __m512 acc[MAX_HS / 16];
    for (int d = 0; d < hs; d += 16) acc[d / 16] = _mm512_setzero_ps();
    for (int j = 0; j < L; j++) {
        const float *vr = vb + (int64_t)(slots ? slots[j] : j) * hs;
        __m512 pj = _mm512_set1_ps(s[j]);
        for (int d = 0; d < hs; d += 16)
            acc[d / 16] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + d), acc[d / 16]);
    }
    __m512 inv = _mm512_set1_ps(1.0f / total);
    for (int d = 0; d < hs; d += 16)
        _mm512_storeu_ps(o + d, _mm512_mul_ps(acc[d / 16], inv));
#else
    for (int j = 0; j < L; j++) {
        const float *kr = kb + (int64_t)(slots ? slots[j] : j) * hs;
        float part[16] = {0};
        for (int d = 0; d < hs; d += 16)
            for (int l = 0; l < 16; l++)
                part[l] = fmaf(qr[d + l], kr[d + l], part[l]);
        float dot = 0.0f;
        for (int l = 0; l < 16; l++)
            dot += part[l];
        s[j] = dot * scale;
        best = s[j] > best ? s[j] : best;
    }
    float total = 0.0f, acc[MAX_HS] = {0};
    for (int j = 0; j < L; j++) {
        s[j] = exp_neg(s[j] - best);
        total += s[j];
    }
    for (int j = 0; j < L; j++) {
        const float *vr = vb + (int64_t)(slots ? slots[j] : j) * hs;
        for (int d = 0; d < hs; d++)
            acc[d] = fmaf(s[j], vr[d], acc[d]);
    }
    const float inv = 1.0f / total;
    for (int d = 0; d < hs; d++)
        o[d] = acc[d] * inv;
#endif
}

/* q: (B, n_head, T, hs) contiguous; k, v: (B, n_kv, max_len, hs); n, ofs: (T,); idx: the tree rows' slots;
   out: (B, T, n_head, hs). Returns 0; -1 for sizes beyond MAX_KEYS / MAX_HS or a head count n_kv does not divide. */
int attend_rows(int B, int T, int n_head, int n_kv, int hs, int max_len, const float *q, const float *k,
                const float *v, const int32_t *n, const int32_t *ofs, const int32_t *idx, float scale, float *out,
                int threads) {
    if (hs > MAX_HS || hs % 16 || n_kv <= 0 || n_head % n_kv)
        return -1;
    for (int t = 0; t < T; t++)
        if (n[t] <= 0 || n[t] > MAX_KEYS || n[t] > max_len)
            return -1;
    const int g = n_head / n_kv;
    const int jobs = B * T * n_head;
    int failed = 0;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) reduction(| : failed)
#endif
    for (int job = 0; job < jobs; job++) {
        const int b = job / (T * n_head), t = (job / n_head) % T, h = job % n_head, kv = h / g;
        const float *qr = q + (((int64_t)b * n_head + h) * T + t) * hs;
        const int64_t head = ((int64_t)b * n_kv + kv) * max_len * hs;
        const float *kb = k + head, *vb = v + head;
        float *o = out + (((int64_t)b * T + t) * n_head + h) * hs;
        const int L = n[t];
        float *s = malloc(sizeof(float) * (size_t)L);
        if (!s) { failed = 1; continue; }
        softmax_row(qr, kb, vb, hs, L, ofs[t] < 0 ? NULL : idx + ofs[t], scale, s, o);
        free(s);
    }
    return failed ? -2 : 0;
}
