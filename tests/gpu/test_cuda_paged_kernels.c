/*
 * cuda_kv_paged and cuda_attention at model shapes, the plugins called
 * directly (ctest label "gpu"; skipped cleanly where no CUDA device is
 * present). The model tests (test_cuda_paged.c) run head_dim 8 and 16 only;
 * these cases run head_dim 16, 64 and 128, GQA groups 2 to 8, two layers,
 * blocks of 16 and of 5 tokens, bf16 and f8_e4m3.
 *
 * Two sequences are appended in interleaved chunks, one is truncated and
 * re-extended, so that its block table is scattered over the pool. Then:
 * 1. The stored keys and values, read back through the view exactly as
 *    slots/tsr_kv_cache.h documents it (block table, block stride, slots of
 *    the scales), against the f32 inputs: bf16 bit for bit tsr_f32_to_bf16;
 *    f8_e4m3 bit for bit tsr_f32_to_f8e4m3(x * (448 / amax)) with scale
 *    amax / 448 (amax over the token's head; the same IEEE f32 operations
 *    and the same saturating round-to-nearest-even as the kernel), and, as
 *    the lossy bound the manifest rests on, |scale * q - x| <= 2^-4 |x| +
 *    2^-10 scale (E4M3: 3 mantissa bits; subnormal steps of 2^-9).
 * 2. Attention of passes of 1, 2, 3, 5, 7, 8 (cluster_kernel where head_dim is 64
 *    or 128, else split-K; 2-8 rows over bf16 packed_kernel, and again
 *    through cluster_kernel with packed_rows 0) and 40 rows (the
 *    tensor-core prefill kernel for bf16, cluster_kernel or split-K for
 *    fp8) at the end of the sequence,
 *    through the paged view and through a contiguous copy of it, with every
 *    key and with a sliding window of 97, against a plain f64 reference
 *    over the stored values read back in 1: |out - ref| <= 1e-3 * max|ref|
 *    + 1e-5 per element and NMSE <= 1e-7 (the bound of test_cuda_prefill.c;
 *    the arithmetic is f32 over the same stored values, only the order of
 *    the sums differs).
 * 3. usage(): used = the blocks the two sequences hold, capacity = the pool.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "kernels/dtype.h"
#include "slots/tsr_attention.h"
#include "slots/tsr_kv_cache.h"
#ifdef TESSERA_CUDA
#include "core/cuda/device.h"
#endif

#define TOL_REL 1e-3
#define TOL_ABS 1e-5
#define TOL_NMSE 1e-7

typedef struct kcase {
    int n_heads, n_kv_heads, head_dim, block_size;
    const char *dtype;
    int tokens; /* of the sequence checked */
} kcase;

static const kcase cases[] = {
    {32, 8, 128, 16, "bf16", 700},    /* Llama-3-8B's attention shape */
    {32, 8, 128, 16, "f8_e4m3", 700},
    {16, 2, 64, 5, "bf16", 301},      /* group 8, blocks not a power of two */
    {16, 2, 64, 5, "f8_e4m3", 301},
    {4, 2, 16, 16, "bf16", 130},      /* the fixtures' shape */
    {4, 2, 16, 3, "f8_e4m3", 130},
};

#define N_LAYERS 2

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [-1, 1). */
static float rng_f(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

#ifdef TESSERA_CUDA

/* --- a minimal host for plugin instances ----------------------------------- */

#include "tests/gpu/gpu_host.h"

static void *dev(size_t bytes) {
    tsr_error err;
    tsr_error_clear(&err);
    void *p = tsr_cuda_malloc(bytes, &err);
    if (!p) fail_msg("device allocation of %zu bytes: %s", bytes, err.msg);
    return p;
}

/* --- the case ------------------------------------------------------------------ */

/* f32 keys and values of one sequence: [layer][room tokens][kv head][dim] */
typedef struct seq_data {
    float *k, *v;
    int id, n, room;
} seq_data;

static const tsr_exec *exec_eager(void) {
    static tsr_exec ex;
    ex = (tsr_exec){.device = TSR_DEVICE_CUDA, .device_id = 0, .stream = tsr_cuda_stream(), .n_threads = 1};
    return &ex;
}

/* Append tokens [s->n, s->n + rows) of s (every layer) through the plugin. */
static void append(gpu_instance *kv, seq_data *s, int rows, int te, float *stage_k, float *stage_v) {
    const tsr_kv_cache_i *it = kv->desc->iface;
    for (int l = 0; l < N_LAYERS; l++) {
        const int64_t at = ((int64_t)l * s->room + s->n) * te;
        gpu_upload(stage_k, s->k + at, (size_t)rows * te * sizeof(float));
        gpu_upload(stage_v, s->v + at, (size_t)rows * te * sizeof(float));
        plugin_err[0] = 0;
        const int rc = it->append(kv->inst, s->id, l, s->n, rows, stage_k, stage_v, exec_eager());
        if (rc != TSR_OK) fail_msg("append layer %d at %d + %d: status %d: %s", l, s->n, rows, rc, plugin_err);
        /* the next upload overwrites the stage: wait for the store */
        tsr_error err;
        tsr_error_clear(&err);
        if (tsr_cuda_sync(&err) != TSR_OK) fail_msg("append layer %d: %s", l, err.msg);
    }
    s->n += rows;
}

/* Element e (t, h, d) of a view as the header documents it, widened, and
 * the slot of token t. */
static int64_t view_elem(const tsr_kv_view *v, const int32_t *table, int t, int h, int d, int64_t *slot) {
    const int64_t b = table[t / v->block_size], i = t % v->block_size;
    *slot = b * v->block_size + i;
    return b * v->block_stride + i * v->token_stride + h * v->head_stride + d;
}

static void run_case(const kcase *c, uint64_t *rng) {
    const int hd = c->head_dim, n_kv = c->n_kv_heads, te = n_kv * hd, T = c->tokens;
    const int fp8 = !strcmp(c->dtype, "f8_e4m3");
    const int capacity = 2 * T + 64;
    tsr_model_desc md = {.arch = "llama", .n_layers = N_LAYERS, .hidden = c->n_heads * hd, .n_heads = c->n_heads,
                         .n_kv_heads = n_kv, .head_dim = hd, .ffn = 64, .vocab = 256, .max_ctx = capacity,
                         .weight_dtype = TSR_DTYPE_BF16};
    tsr_param kp[3] = {{"dtype", TSR_PARAM_STRING, {.s = c->dtype}},
                       {"block_size", TSR_PARAM_INT, {.i = c->block_size}},
                       {"capacity_tokens", TSR_PARAM_INT, {.i = capacity}}};
    gpu_instance *kv = gpu_instance_new("cuda_kv_paged", TSR_SLOT_KV_CACHE, &md, kp, 3);
    gpu_instance *at = gpu_instance_new("cuda_attention", TSR_SLOT_ATTENTION, &md, NULL, 0);
    const tsr_param no_packed = {"packed_rows", TSR_PARAM_INT, {.i = 0}}; /* cluster_kernel at 2-8 rows */
    gpu_instance *atc = gpu_instance_new("cuda_attention", TSR_SLOT_ATTENTION, &md, &no_packed, 1);
    const tsr_kv_cache_i *it = kv->desc->iface;

    /* two sequences, random K/V with a per-head spread of magnitudes */
    seq_data s[2];
    const int64_t per = (int64_t)N_LAYERS * T * te;
    for (int i = 0; i < 2; i++) {
        s[i].room = T;
        s[i].k = malloc((size_t)per * sizeof(float));
        s[i].v = malloc((size_t)per * sizeof(float));
        assert_true(s[i].k && s[i].v);
        for (int64_t j = 0; j < per; j++) {
            const float mag = (float)(1 + (j / hd) % 7); /* heads of different amax */
            s[i].k[j] = 2.0f * mag * rng_f(rng);
            s[i].v[j] = mag * rng_f(rng);
        }
        s[i].n = 0;
        plugin_err[0] = 0;
        if (it->seq_alloc(kv->inst, T, &s[i].id) != TSR_OK) fail_msg("seq_alloc: %s", plugin_err);
    }
    float *stage_k = dev((size_t)64 * te * sizeof(float)), *stage_v = dev((size_t)64 * te * sizeof(float));
    /* interleaved chunks, then seq 0 cut back and re-extended: its table is scattered */
    const int chunks[] = {37, 1, 64, 3, 20};
    for (int r = 0; s[0].n < T / 2; r++)
        for (int i = 0; i < 2; i++) {
            int rows = chunks[(r + i) % 5];
            if (rows > T / 2 - s[i].n) rows = T / 2 - s[i].n;
            if (rows > 0) append(kv, &s[i], rows, te, stage_k, stage_v);
        }
    plugin_err[0] = 0;
    if (it->truncate(kv->inst, s[0].id, T / 5) != TSR_OK) fail_msg("truncate: %s", plugin_err);
    s[0].n = T / 5;
    for (int r = 0; s[0].n < T || s[1].n < T; r++)
        for (int i = 0; i < 2; i++) {
            int rows = chunks[(r + 2 * i) % 5];
            if (rows > T - s[i].n) rows = T - s[i].n;
            if (rows > 0) append(kv, &s[i], rows, te, stage_k, stage_v);
        }

    /* 3. usage: the blocks both hold, of the pool */
    uint64_t used, cap;
    it->usage(kv->inst, &used, &cap);
    const int nb_pool = (capacity + c->block_size - 1) / c->block_size, nb = (T + c->block_size - 1) / c->block_size;
    const uint64_t per_block = (uint64_t)N_LAYERS * c->block_size * te * (fp8 ? 1 : 2) * 2 +
                               (fp8 ? (uint64_t)N_LAYERS * c->block_size * n_kv * 4 * 2 : 0);
    assert_int_equal(cap, (uint64_t)nb_pool * per_block);
    assert_int_equal(used, (uint64_t)2 * nb * per_block);

    /* 1. what is stored, read back through the view of seq 0 */
    const int64_t pool_elems = (int64_t)nb_pool * c->block_size * te, pool_slots = (int64_t)nb_pool * c->block_size;
    const size_t esize = fp8 ? 1 : 2;
    unsigned char *kb = malloc((size_t)pool_elems * esize), *vb = malloc((size_t)pool_elems * esize);
    float *ks = malloc((size_t)pool_slots * n_kv * sizeof(float)), *vs = malloc((size_t)pool_slots * n_kv * sizeof(float));
    int32_t *table = malloc((size_t)nb * sizeof *table);
    double *kd = malloc((size_t)T * te * sizeof(double)), *vd = malloc((size_t)T * te * sizeof(double));
    assert_true(kb && vb && ks && vs && table && kd && vd);
    const int layer = N_LAYERS - 1; /* the second layer: layer offsets count */
    tsr_kv_view view;
    assert_int_equal(it->view(kv->inst, s[0].id, layer, &view), TSR_OK);
    assert_int_equal(view.n_tokens, T);
    assert_int_equal(view.layout, TSR_KV_PAGED);
    assert_int_equal(view.dtype, fp8 ? TSR_DTYPE_F8_E4M3 : TSR_DTYPE_BF16);
    assert_int_equal(view.block_size, c->block_size);
    gpu_download(table, view.block_table, (size_t)nb * sizeof *table);
    int scattered = 0;
    for (int b = 0; b < nb; b++) {
        assert_true(table[b] >= 0 && table[b] < nb_pool);
        scattered += b > 0 && table[b] != table[b - 1] + 1;
    }
    /* the pool slice of this layer: block ids index it from view.k */
    gpu_download(kb, view.k, (size_t)pool_elems * esize);
    gpu_download(vb, view.v, (size_t)pool_elems * esize);
    if (fp8) {
        gpu_download(ks, view.k_scale, (size_t)pool_slots * n_kv * sizeof(float));
        gpu_download(vs, view.v_scale, (size_t)pool_slots * n_kv * sizeof(float));
    }
    double worst_q = 0;
    for (int kvsel = 0; kvsel < 2; kvsel++) {
        const unsigned char *pool = kvsel ? vb : kb;
        const float *scales = kvsel ? vs : ks, *src = (kvsel ? s[0].v : s[0].k) + (int64_t)layer * T * te;
        double *out = kvsel ? vd : kd;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < n_kv; h++) {
                const float *x = src + (int64_t)t * te + h * hd;
                float amax = 0.0f;
                for (int d = 0; d < hd; d++)
                    if (fabsf(x[d]) > amax) amax = fabsf(x[d]);
                for (int d = 0; d < hd; d++) {
                    int64_t slot;
                    const int64_t e = view_elem(&view, table, t, h, d, &slot);
                    double got;
                    if (!fp8) {
                        uint16_t u;
                        memcpy(&u, pool + e * 2, 2);
                        if (u != tsr_f32_to_bf16(x[d]))
                            fail_msg("%s t %d h %d d %d: stored bf16 0x%04x, want 0x%04x", kvsel ? "V" : "K", t, h, d,
                                     u, tsr_f32_to_bf16(x[d]));
                        got = tsr_bf16_to_f32(u);
                    } else {
                        const float sc = scales[slot * n_kv + h], want_sc = amax / 448.0f;
                        const uint8_t q = pool[e], want_q = tsr_f32_to_f8e4m3(x[d] * (448.0f / amax));
                        if (memcmp(&sc, &want_sc, sizeof sc))
                            fail_msg("%s t %d h %d: scale %.9g, want %.9g", kvsel ? "V" : "K", t, h, sc, want_sc);
                        if (q != want_q)
                            fail_msg("%s t %d h %d d %d: stored 0x%02x, want 0x%02x (x %.9g, scale %.9g)",
                                     kvsel ? "V" : "K", t, h, d, q, want_q, x[d], sc);
                        got = (double)tsr_f8e4m3_to_f32(q) * sc;
                        /* + 1e-6 |x|: the f32 roundings of x * inv and q * scale */
                        const double err = fabs(got - x[d]), bound = 0.0625 * fabs(x[d]) + sc / 1024.0;
                        if (!(err <= bound + 1e-6 * fabs(x[d])))
                            fail_msg("t %d h %d d %d: |%.9g - %.9g| > %.3g", t, h, d, got, x[d], bound);
                        if (err / (bound + 1e-30) > worst_q) worst_q = err / bound;
                    }
                    out[(int64_t)t * te + h * hd + d] = got;
                }
            }
    }

    /* the same stored values laid out contiguously (token t at t * te, its
     * scales at slot t), for cuda_attention's contiguous path */
    unsigned char *ck = malloc((size_t)T * te * esize), *cvb = malloc((size_t)T * te * esize);
    float *cks = malloc((size_t)T * n_kv * sizeof(float)), *cvs = malloc((size_t)T * n_kv * sizeof(float));
    assert_true(ck && cvb && cks && cvs);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_kv; h++) {
            int64_t slot = 0;
            for (int d = 0; d < hd; d++) {
                const int64_t e = view_elem(&view, table, t, h, d, &slot), o = (int64_t)t * te + h * hd + d;
                memcpy(ck + o * esize, kb + e * esize, esize);
                memcpy(cvb + o * esize, vb + e * esize, esize);
            }
            cks[t * n_kv + h] = fp8 ? ks[slot * n_kv + h] : 0.0f;
            cvs[t * n_kv + h] = fp8 ? vs[slot * n_kv + h] : 0.0f;
        }
    void *ck_d = dev((size_t)T * te * esize), *cv_d = dev((size_t)T * te * esize);
    float *cks_d = dev((size_t)T * n_kv * sizeof(float)), *cvs_d = dev((size_t)T * n_kv * sizeof(float));
    gpu_upload(ck_d, ck, (size_t)T * te * esize);
    gpu_upload(cv_d, cvb, (size_t)T * te * esize);
    gpu_upload(cks_d, cks, (size_t)T * n_kv * sizeof(float));
    gpu_upload(cvs_d, cvs, (size_t)T * n_kv * sizeof(float));
    tsr_kv_view cview = view;
    cview.layout = TSR_KV_CONTIGUOUS, cview.k = ck_d, cview.v = cv_d, cview.token_stride = te, cview.head_stride = hd;
    cview.block_table = NULL, cview.block_size = 0, cview.block_stride = 0;
    cview.k_scale = fp8 ? cks_d : NULL, cview.v_scale = fp8 ? cvs_d : NULL;

    /* 2. attention at the end of seq 0 against f64 over the stored values,
     * through the paged view and the contiguous copy */
    static const struct {
        int rows, window; /* window 0: every key */
    } passes[] = {{1, 0}, {2, 0}, {3, 0}, {5, 0}, {8, 0}, {40, 0}, {1, 97}, {7, 97}, {8, 97}, {40, 97}};
    const float scale = 1.0f / sqrtf((float)hd);
    for (size_t ri = 0; ri < sizeof passes / sizeof *passes; ri++) {
        const int rows = passes[ri].rows, window = passes[ri].window, pos0 = T - rows;
        const int64_t qn = (int64_t)rows * c->n_heads * hd;
        float *q = malloc((size_t)qn * sizeof *q), *got = malloc((size_t)qn * sizeof *got);
        double *want = malloc((size_t)qn * sizeof *want), *sc = malloc((size_t)T * sizeof *sc);
        assert_true(q && got && want && sc);
        for (int64_t i = 0; i < qn; i++) q[i] = 2.0f * rng_f(rng);
        const int group = c->n_heads / n_kv;
        for (int i = 0; i < rows; i++)
            for (int h = 0; h < c->n_heads; h++) {
                const float *qr = q + ((int64_t)i * c->n_heads + h) * hd;
                const int kvh = h / group, last = pos0 + i;
                const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
                double mx = -INFINITY, sum = 0;
                for (int t = first; t <= last; t++) {
                    double acc = 0;
                    for (int d = 0; d < hd; d++) acc += (double)qr[d] * kd[(int64_t)t * te + kvh * hd + d];
                    sc[t] = acc * scale;
                    if (sc[t] > mx) mx = sc[t];
                }
                double *o = want + ((int64_t)i * c->n_heads + h) * hd;
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int t = first; t <= last; t++) {
                    const double w = exp(sc[t] - mx);
                    sum += w;
                    for (int d = 0; d < hd; d++) o[d] += w * vd[(int64_t)t * te + kvh * hd + d];
                }
                for (int d = 0; d < hd; d++) o[d] /= sum;
            }
        float *q_d = dev((size_t)qn * sizeof *q), *out_d = dev((size_t)qn * sizeof *q);
        gpu_upload(q_d, q, (size_t)qn * sizeof *q);
        assert_int_equal(it->view(kv->inst, s[0].id, layer, &view), TSR_OK);
        for (int run = 0; run < 4; run++) {
            /* runs 0, 1: paged, contiguous; 2, 3: the same through cluster_kernel where packed_kernel took them */
            const int contiguous = run & 1, plain = run >> 1;
            if (plain && !(rows >= 2 && rows <= 8 && !fp8 && (hd == 64 || hd == 128))) continue;
            tsr_attn_args a = {rows, pos0, c->n_heads, n_kv, hd, scale, window, q_d, contiguous ? &cview : &view,
                               out_d};
            const gpu_instance *ain = plain ? atc : at;
            const tsr_attention_i *ai = ain->desc->iface;
            plugin_err[0] = 0;
            const int rc = ai->run(ain->inst, &a, exec_eager());
            if (rc != TSR_OK) fail_msg("cuda_attention: status %d: %s", rc, plugin_err);
            gpu_download(got, out_d, (size_t)qn * sizeof *got);
            double max_ref = 0, max_diff = 0, num = 0, den = 0;
            for (int64_t i = 0; i < qn; i++)
                if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
            const double bound = TOL_REL * max_ref + TOL_ABS;
            for (int64_t i = 0; i < qn; i++) {
                const double d = fabs((double)got[i] - want[i]);
                if (!(d <= bound))
                    fail_msg("%s heads %d/%d d %d %s, %d rows at %d, window %d: out[%lld] = %.9g, reference %.9g "
                             "(|diff| > %.3g)", c->dtype, c->n_heads, n_kv, hd, contiguous ? "contiguous" : "paged",
                             rows, pos0, window, (long long)i, got[i], want[i], bound);
                if (d > max_diff) max_diff = d;
                num += d * d;
                den += want[i] * want[i];
            }
            const double nmse = num / den;
            if (!(nmse <= TOL_NMSE)) fail_msg("nmse %.3g > %.0e", nmse, TOL_NMSE);
            if (contiguous)
                printf("# %-7s heads %2d/%d d %3d, contiguous, %2d rows at %3d, window %2d%s: max |diff| %.3g (bound "
                       "%.3g), nmse %.3g\n", c->dtype, c->n_heads, n_kv, hd, rows, pos0, window,
                       plain ? ", packed_rows 0" : "", max_diff, bound, nmse);
            else
                printf("# %-7s heads %2d/%d d %3d, blocks of %2d (%d of %d not after their predecessor), %2d rows at "
                       "%3d, window %2d%s: max |diff| %.3g (bound %.3g), nmse %.3g\n", c->dtype, c->n_heads, n_kv, hd,
                       c->block_size, scattered, nb, rows, pos0, window, plain ? ", packed_rows 0" : "", max_diff,
                       bound, nmse);
        }
        tsr_cuda_free(q_d);
        tsr_cuda_free(out_d);
        free(q), free(got), free(want), free(sc);
    }
    tsr_cuda_free(ck_d), tsr_cuda_free(cv_d), tsr_cuda_free(cks_d), tsr_cuda_free(cvs_d);
    free(ck), free(cvb), free(cks), free(cvs);
    if (fp8) printf("# %s: worst stored |error| %.0f%% of the E4M3 bound\n", c->dtype, 100 * worst_q);
    assert_true(scattered > 0);

    for (int i = 0; i < 2; i++) {
        it->seq_free(kv->inst, s[i].id);
        free(s[i].k);
        free(s[i].v);
    }
    it->usage(kv->inst, &used, &cap);
    assert_int_equal(used, 0);
    tsr_cuda_free(stage_k);
    tsr_cuda_free(stage_v);
    free(kb), free(vb), free(ks), free(vs), free(table), free(kd), free(vd);
    gpu_instance_free(at);
    gpu_instance_free(atc);
    gpu_instance_free(kv);
}

static void test_paged_kernels(void **state) {
    (void)state;
    if (tsr_cuda_device_count() <= 0) {
        printf("# no CUDA device: paged kernel checks skipped\n");
        skip();
    }
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_cuda_init(0, &err) != TSR_OK) fail_msg("CUDA init: %s", err.msg);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i], &rng);
}

#else

static void test_paged_kernels(void **state) {
    (void)state;
    (void)cases;
    (void)rng_f;
    printf("# built without CUDA: paged kernel checks skipped\n");
    skip();
}

#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
