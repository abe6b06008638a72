/* Row-invariant kernels for minigpt's "w4a8" path (minigpt/kernels/__init__.py builds and loads them): products of
   4-bit or 8-bit weights and 8-bit activations (minigpt/quant.py's W4A8Linear and Q8A8Linear lay the weights out
   and call them), and attention one query row at a time (at the end of this file).

   4-bit weights (the blocks' layers):

       y[r, n] = sum over groups g, in order, of   step[n, g] * dx[r, g] * dot(r, n, g)  +  lo[n, g] * xs[r, g]

   Weights: 4-bit integers q in 0..15 with a step and a minimum per group of 32 inputs (the layout of a GGUF file's
   Q4_1 blocks), a weight being q * step + lo. Activations: each group of 32 inputs of a row rounded to int8 with a
   scale dx of its own (its largest magnitude / 127: llama.cpp's Q8 blocks); dot(r, n, g) is the group's 32 products
   of int8 activations and 4-bit weights summed in int32, and xs[r, g] = dx[r, g] * (sum of the group's int8 values),
   so the minimum's share is one product.

   8-bit weights (the output layer, as a GGUF file's Q8_0 blocks keep it: an int8 q in -127..127 and one scale per
   group of 32 inputs, a weight being q * scale):

       y[r, n] = sum over groups g, in order, of   (scale[n, g] * dx[r, g]) * (dot(r, n, g) - 128 * sx[r, g])

   The weights are stored as q + 128 (0..255: vpdpbusd multiplies unsigned bytes by signed ones), so dot(r, n, g),
   the group's 32 products summed in int32, is 128 * sx[r, g] (sx: the sum of the group's int8 activations) more than
   the signed weights' products: the difference is exactly theirs, in integers.

   Why a row's result cannot depend on how many rows share the call: a group's products are summed in int32, which
   is exact, so in whatever order and in however many partial sums; the groups' scaled sums are then added in fp32
   in one fixed order (g = 0, 1, ...: a multiply and one or two fused multiply-adds), the same operations for every
   row whatever the number of rows. What the rows share is each (unpacked) register of weights, used by up to eight
   rows in turn: that is why a pass over several tokens costs less than that many one-token passes.

   Layout: outputs in blocks of 16 (the 16 fp32 lanes of a 512-bit register, one output per lane). 4-bit: for block
   b, group g and quad j (inputs 4j .. 4j + 3 of the group), 32 bytes: byte 4i + t holds the weight of output i,
   input 4j + t in its low 4 bits and that of output 8 + i in its high 4 bits. Unpacked, that is one 64-byte
   register whose lane i holds output i's four weights: one vpdpbusd against the quad of activations, broadcast,
   adds the quad's four products into each output's lane. 8-bit: that register as it is, 64 bytes per (block, group,
   quad). step, lo and scale are laid out (block, group, 16).

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

#define LANES 16
#define QUADS 8            /* quads of 4 inputs in a group of 32 */

int w4a8_vector_path(void) { return W4A8_VNNI; }

/* Each group of 32 inputs of each row of x (rows, K) rounded to int8 with a scale of its own: xq (rows, K),
   dx (rows, K / 32), sx = the sum of the group's int8 values, xs = dx * sx. Element by element, with exact sums: a
   row's numbers depend on that row alone. */
static void quantize_rows(int rows, int K, const float *x, int8_t *xq, float *dx, float *xs, int32_t *sx) {
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
            sx[(int64_t)r * G + g] = sum;
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

/* Weight register i of a block: 4-bit ones unpacked, 8-bit ones as they are. */
static inline __m512i weights(const int bits, const uint8_t *wb, int i) {
    return bits == 4 ? unpack(wb + 32 * i) : _mm512_loadu_si512(wb + 64 * i);
}

static inline __m512i quad(const int8_t *x) {   /* four activations, broadcast to every lane */
    int32_t four;
    memcpy(&four, x, 4);
    return _mm512_set1_epi32(four);
}

/* R rows (R a constant where it is called: 8, 4, 2 or 1) against one block of 16 outputs of ``bits``-bit weights,
   into y: each weight register is unpacked once and meets the R rows' activations, each row's sums in two chains
   (even and odd quads, added at the end: integers, so exactly the group's sum) so that their products overlap. */
static inline __attribute__((always_inline)) void rows_at_once(const int R, const int bits, int G, int K, int N,
        const uint8_t *wb, const float *st, const float *lo, const int8_t *xq, const float *dx, const float *xs,
        const int32_t *sx, float *y, __mmask16 store) {
    __m512 acc[8];
    for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) {
        __m512i d0[8], d1[8];
        for (int i = 0; i < R; i++) d0[i] = d1[i] = _mm512_setzero_si512();
        for (int j = 0; j < QUADS; j += 2) {
            const __m512i w0 = weights(bits, wb, g * QUADS + j), w1 = weights(bits, wb, g * QUADS + j + 1);
            for (int i = 0; i < R; i++) {
                const int8_t *x = xq + (int64_t)i * K + 32 * g + 4 * j;
                d0[i] = _mm512_dpbusd_epi32(d0[i], w0, quad(x));
                d1[i] = _mm512_dpbusd_epi32(d1[i], w1, quad(x + 4));
            }
        }
        const __m512 s = _mm512_loadu_ps(st + LANES * g);
        const __m512 l = bits == 4 ? _mm512_loadu_ps(lo + LANES * g) : _mm512_setzero_ps();
        for (int i = 0; i < R; i++) {
            const __m512i dot = _mm512_add_epi32(d0[i], d1[i]);
            const float d = dx[(int64_t)i * G + g];
            if (bits == 4) {    /* acc += dot * (step * dx) ; acc += lo * xs */
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(d)), acc[i]);
                acc[i] = _mm512_fmadd_ps(l, _mm512_set1_ps(xs[(int64_t)i * G + g]), acc[i]);
            } else {            /* acc += (dot - 128 sx) * (scale * dx) */
                const __m512i exact = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * sx[(int64_t)i * G + g]));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(s, _mm512_set1_ps(d)), acc[i]);
            }
        }
    }
    for (int i = 0; i < R; i++)
        _mm512_mask_storeu_ps(y + (int64_t)i * N, store, acc[i]);
}

/* One block of 16 outputs (``wb``: its weights) for all rows, eight at a time, then four, two, one: a row's
   arithmetic is the same whichever rows share its call. */
static inline __attribute__((always_inline)) void block(const int bits, int rows, int K, int n_valid,
        const uint8_t *wb, const float *st, const float *lo, const int8_t *xq, const float *dx, const float *xs,
        const int32_t *sx, float *y, int N) {
    const int G = K / 32;
    const __mmask16 store = n_valid >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << n_valid) - 1);
    int r = 0;
#define ROWS(R) rows_at_once(R, bits, G, K, N, wb, st, lo, xq + (int64_t)r * K, dx + (int64_t)r * G, \
                             xs + (int64_t)r * G, sx + (int64_t)r * G, y + (int64_t)r * N, store)
    for (; r + 8 <= rows; r += 8) ROWS(8);
    if (r + 4 <= rows) { ROWS(4); r += 4; }
    if (r + 2 <= rows) { ROWS(2); r += 2; }
    if (r < rows) ROWS(1);
#undef ROWS
}
#else
static void block(const int bits, int rows, int K, int n_valid, const uint8_t *wb, const float *st, const float *lo,
                  const int8_t *xq, const float *dx, const float *xs, const int32_t *sx, float *y, int N) {
    const int G = K / 32;
    for (int r = 0; r < rows; r++) {
        float acc[LANES] = {0};
        for (int g = 0; g < G; g++) {
            int32_t dot[LANES] = {0};
            for (int j = 0; j < QUADS; j++) {
                const int8_t *x = xq + (int64_t)r * K + 32 * g + 4 * j;
                if (bits == 4) {
                    const uint8_t *w = wb + (g * QUADS + j) * 32;
                    for (int i = 0; i < 8; i++)
                        for (int t = 0; t < 4; t++) {
                            dot[i] += (int32_t)(w[4 * i + t] & 0x0F) * x[t];
                            dot[8 + i] += (int32_t)(w[4 * i + t] >> 4) * x[t];
                        }
                } else {
                    const uint8_t *w = wb + (g * QUADS + j) * 64;
                    for (int i = 0; i < LANES; i++)
                        for (int t = 0; t < 4; t++)
                            dot[i] += (int32_t)w[4 * i + t] * x[t];
                }
            }
            const int64_t rg = (int64_t)r * G + g;
            for (int i = 0; i < LANES; i++) {
                if (bits == 4) {
                    acc[i] = fmaf((float)dot[i], st[LANES * g + i] * dx[rg], acc[i]);
                    acc[i] = fmaf(lo[LANES * g + i], xs[rg], acc[i]);
                } else {
                    acc[i] = fmaf((float)(dot[i] - 128 * sx[rg]), st[LANES * g + i] * dx[rg], acc[i]);
                }
            }
        }
        for (int i = 0; i < n_valid && i < LANES; i++)
            y[(int64_t)r * N + i] = acc[i];
    }
}
#endif

/* y (rows, N) = x (rows, K) times ``bits``-bit weights by the formulas above. Returns 0; -1 if K is not a positive
   multiple of 32; -2 if out of memory. ``threads`` > 1 splits the blocks of outputs among OpenMP threads (where
   built with OpenMP): each (row, output) is still computed by one thread, in one order. */
static int linear(const int bits, int rows, int N, int K, const float *x, const uint8_t *wq, const float *step,
                  const float *lo, float *y, int threads) {
    if (K <= 0 || K % 32)
        return -1;
    const int G = K / 32, blocks = (N + LANES - 1) / LANES, block_bytes = G * QUADS * (bits == 4 ? 32 : 64);
    int8_t *xq = malloc((size_t)rows * K);
    float *dx = malloc(sizeof(float) * (size_t)rows * G), *xs = malloc(sizeof(float) * (size_t)rows * G);
    int32_t *sx = malloc(sizeof(int32_t) * (size_t)rows * G);
    const int failed = !xq || !dx || !xs || !sx;
    if (!failed) {
        quantize_rows(rows, K, x, xq, dx, xs, sx);
        (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
#endif
        for (int b = 0; b < blocks; b++) {
            const uint8_t *wb = wq + (int64_t)b * block_bytes;
            const float *sb = step + (int64_t)b * G * LANES, *lb = lo ? lo + (int64_t)b * G * LANES : NULL;
            if (bits == 4)
                block(4, rows, K, N - b * LANES, wb, sb, lb, xq, dx, xs, sx, y + (int64_t)b * LANES, N);
            else
                block(8, rows, K, N - b * LANES, wb, sb, lb, xq, dx, xs, sx, y + (int64_t)b * LANES, N);
        }
    }
    free(xq); free(dx); free(xs); free(sx);
    return failed ? -2 : 0;
}

/* 4-bit weights: ``wq`` (ceil(N / 16), K / 32, 8, 32) bytes; ``step``, ``lo``: (ceil(N / 16), K / 32, 16) fp32. */
int w4a8_linear(int rows, int N, int K, const float *x, const uint8_t *wq, const float *step, const float *lo,
                float *y, int threads) {
    return linear(4, rows, N, K, x, wq, step, lo, y, threads);
}

/* 8-bit weights: ``wq`` (ceil(N / 16), K / 32, 8, 64) bytes, each q + 128; ``scale``: (ceil(N / 16), K / 32, 16). */
int q8a8_linear(int rows, int N, int K, const float *x, const uint8_t *wq, const float *scale, float *y,
                int threads) {
    return linear(8, rows, N, K, x, wq, scale, NULL, y, threads);
}

/* ---------------------------------------------------------------------------------------------------------------
   Attention, one query row at a time, in an order that depends on that row alone (minigpt.precision's
   InvariantAttention with its compiled road).

   For each sequence b, query row t and head h (key head h / (n_head / n_kv)): the row's keys are the cache slots
   0 .. n[t] - 1, or, where ofs[t] >= 0, the n[t] slots idx[ofs[t]] ... (a token tree's node: its ancestors and
   itself, in order). scores s_j = (q . k_j) * scale, each dot product summed in 16 partial sums over the head's
   numbers, then those 16 added pairwise (the vector road, lanes i and i + 8 first) or in order (the portable road);
   softmax with the row's own maximum, the exponentials summed in 16 partial sums (key j in lane j mod 16) then
   pairwise, or key by key (portable); out = (sum_j p_j v_j) / (sum_j p_j), the weighted values added key by key in
   order. Nothing here depends on the number of rows or on the other rows (the vector road computes sixteen keys'
   dot products side by side and the heads that share a key head side by side, each in its own order), so a
   k-token pass gives each row the bits of a one-token step.

   exp: our own, exp(x) = 2^i * p(f) with x log2(e) = i + f, f in [-0.5, 0.5], p a degree-6 polynomial (relative
   error below 2e-7 on the range softmax uses, x <= 0): plain arithmetic, so the compiler can run it 16 at a time,
   and the same bits wherever it runs. */

/* 2^f on [-0.5, 0.5]: Taylor coefficients of e^(f ln 2), highest power first; both exponentials below use them */
static const float EXP2_POLY[7] = {1.54035304e-4f, 1.33335581e-3f, 9.61812911e-3f, 5.55041087e-2f,
                                   2.40226507e-1f, 6.93147181e-1f, 1.0f};
#define LOG2_E 1.44269504088896341f

static inline float exp_neg(float x) {
    if (x < -87.0f) return 0.0f;
    float t = x * LOG2_E;
    float i = rintf(t), f = t - i;
    float p = EXP2_POLY[0];
    for (int c = 1; c < 7; c++)
        p = p * f + EXP2_POLY[c];
    union { float f; int32_t i; } u = { p };
    u.i += (int32_t)i << 23;
    return u.f;
}

#define MAX_KEYS 65536
#define MAX_HS 256

#if W4A8_VNNI
static inline __m512 exp_neg16(__m512 x) {      /* exp_neg, 16 at a time, the same formula */
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(LOG2_E));
    __m512 i = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(t, i);
    __m512 p = _mm512_set1_ps(EXP2_POLY[0]);
    for (int c = 1; c < 7; c++)
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP2_POLY[c]));
    __m512 e = _mm512_scalef_ps(p, i);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ), e, _mm512_setzero_ps());
}

/* Sixteen vectors of 16 partial sums, each summed to one number in one register (lane u: the sum of p[u]), pairing
   lanes as _mm512_reduce_add_ps does (i with i + 8, then i with i + 4, i + 2, i + 1), so each sum has the bits of
   reducing that vector alone: a transposition, with one addition where reducing them one by one spends four. */
static inline __m512 sums16(const __m512 p[16]) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)      /* a[i]: p[2i]'s lanes i + (i + 8) in its low half, p[2i + 1]'s in its high */
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)      /* b[i]: 128-bit lane k holds p[4i + k]'s four sums of lanes i and i + 4 */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)      /* c[i]: lane k holds p[8i + k]'s two sums, then p[8i + 4 + k]'s */
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane 4k + m holds the sum of p[k + 4m]; put it in lane k + 4m */
    const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), d);
}
#endif

/* One query row of one head against its L keys (slots 0 .. L - 1, or ``slots``): the softmax weights unnormalised,
   s[j] = exp(score_j - the largest score), into s; returns their sum. */
static float weights_row(const float *qr, const float *kb, int hs, int L, const int32_t *slots, float scale,
                         float *s) {
#if W4A8_VNNI
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < L; j += 16) {           /* sixteen keys at a time */
        const int keys = L - j < 16 ? L - j : 16;
        const float *kr[16];
        __m512 part[16];
        for (int u = 0; u < 16; u++) {        /* a missing key (past L) repeats the last one; its sum is not kept */
            const int key = j + (u < keys ? u : keys - 1);
            kr[u] = kb + (int64_t)(slots ? slots[key] : key) * hs;
            part[u] = _mm512_mul_ps(_mm512_loadu_ps(qr), _mm512_loadu_ps(kr[u]));
        }
        for (int d = 16; d < hs; d += 16) {   /* the sixteen keys' sums side by side, each in its own order */
            const __m512 qd = _mm512_loadu_ps(qr + d);
            for (int u = 0; u < 16; u++)
                part[u] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(kr[u] + d), part[u]);
        }
        const __mmask16 m = keys == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << keys) - 1);
        const __m512 scores = _mm512_mul_ps(sums16(part), _mm512_set1_ps(scale));
        _mm512_mask_storeu_ps(s + j, m, scores);
        top = _mm512_mask_max_ps(top, m, top, scores);
    }
    top = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < L; j += 16) {
        __mmask16 m = L - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (L - j)) - 1);
        __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), top));
        _mm512_mask_storeu_ps(s + j, m, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
    }
    return _mm512_reduce_add_ps(sum);
#else
    float best = -INFINITY;
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
    float total = 0.0f;
    for (int j = 0; j < L; j++) {
        s[j] = exp_neg(s[j] - best);
        total += s[j];
    }
    return total;
#endif
}

#define GROUP 4     /* query heads of one key head whose weighted sums run side by side */

/* The outputs of ``heads`` (1 .. GROUP) query heads of one row that share the key head: o[h] = (sum over j, in
   order, of s[h * L + j] v_j) / total[h]. Each head's sums are its own, whichever heads run beside it. */
static void weighted_values(int heads, const float *s, const float *total, const float *vb, int hs, int L,
                            const int32_t *slots, float *const *o) {
#if W4A8_VNNI
    for (int d0 = 0; d0 < hs; d0 += 64) {    /* 64 of the head's numbers at a time, the sums kept in registers */
        const int regs = hs - d0 < 64 ? (hs - d0) / 16 : 4;
        __m512 a[GROUP][4];
        for (int h = 0; h < GROUP; h++)
            for (int r = 0; r < 4; r++) a[h][r] = _mm512_setzero_ps();
        for (int j = 0; j < L; j++) {
            const float *vr = vb + (int64_t)(slots ? slots[j] : j) * hs + d0;
            __m512 vj[4];
            for (int r = 0; r < 4; r++) vj[r] = r < regs ? _mm512_loadu_ps(vr + 16 * r) : _mm512_setzero_ps();
            for (int h = 0; h < GROUP; h++) {
                if (h >= heads) break;
                const __m512 p = _mm512_set1_ps(s[(int64_t)h * L + j]);
                for (int r = 0; r < 4; r++) a[h][r] = _mm512_fmadd_ps(p, vj[r], a[h][r]);
            }
        }
        for (int h = 0; h < heads; h++) {
            const __m512 inv = _mm512_set1_ps(1.0f / total[h]);
            for (int r = 0; r < regs; r++) _mm512_storeu_ps(o[h] + d0 + 16 * r, _mm512_mul_ps(a[h][r], inv));
        }
    }
#else
    for (int h = 0; h < heads; h++) {
        float acc[MAX_HS] = {0};
        for (int j = 0; j < L; j++) {
            const float *vr = vb + (int64_t)(slots ? slots[j] : j) * hs;
            for (int d = 0; d < hs; d++)
                acc[d] = fmaf(s[(int64_t)h * L + j], vr[d], acc[d]);
        }
        const float inv = 1.0f / total[h];
        for (int d = 0; d < hs; d++)
            o[h][d] = acc[d] * inv;
    }
#endif
}

/* q: (B, n_head, T, hs) contiguous; k, v: (B, n_kv, max_len, hs); n, ofs: (T,); idx: the tree rows' slots;
   out: (B, T, n_head, hs). Returns 0; -1 for sizes beyond MAX_KEYS / MAX_HS or a head count n_kv does not divide;
   -2 if out of memory. One job per (sequence, row, key head): its query heads' weights one by one, then their
   weighted values GROUP heads at a time, which read each value row once for those heads. */
int attend_rows(int B, int T, int n_head, int n_kv, int hs, int max_len, const float *q, const float *k,
                const float *v, const int32_t *n, const int32_t *ofs, const int32_t *idx, float scale, float *out,
                int threads) {
    if (hs > MAX_HS || hs % 16 || n_kv <= 0 || n_head % n_kv)
        return -1;
    for (int t = 0; t < T; t++)
        if (n[t] <= 0 || n[t] > MAX_KEYS || n[t] > max_len)
            return -1;
    const int g = n_head / n_kv;
    const int jobs = B * T * n_kv;
    int failed = 0;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) reduction(| : failed)
#endif
    for (int job = 0; job < jobs; job++) {
        const int b = job / (T * n_kv), t = (job / n_kv) % T, kv = job % n_kv;
        const int64_t head = ((int64_t)b * n_kv + kv) * max_len * hs;
        const float *kb = k + head, *vb = v + head;
        const int L = n[t];
        const int32_t *slots = ofs[t] < 0 ? NULL : idx + ofs[t];
        float *s = malloc(sizeof(float) * (size_t)L * GROUP);
        if (!s) { failed = 1; continue; }
        for (int h0 = kv * g; h0 < (kv + 1) * g; h0 += GROUP) {
            const int heads = (kv + 1) * g - h0 < GROUP ? (kv + 1) * g - h0 : GROUP;
            float total[GROUP];
            float *o[GROUP];
            for (int i = 0; i < heads; i++) {
                const float *qr = q + (((int64_t)b * n_head + h0 + i) * T + t) * hs;
                total[i] = weights_row(qr, kb, hs, L, slots, scale, s + (int64_t)i * L);
                o[i] = out + (((int64_t)b * T + t) * n_head + h0 + i) * hs;
            }
            weighted_values(heads, s, total, vb, hs, L, slots, o);
        }
        free(s);
    }
    return failed ? -2 : 0;
}
