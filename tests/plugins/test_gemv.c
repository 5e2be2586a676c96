/* test_gemv: y = x . W^T for f32 weights, plus exports for the libffi tests.
 * Built again as test_gemv_v2 (TEST_GEMV_V2): a plugin of gemv interface
 * version 2, from before tsr_weight.scale, that takes f8_e4m3 weights as
 * they are stored: the host must never hand it a scaled weight. And as
 * test_gemv_roles (TEST_GEMV_ROLES): it refuses a weight whose role
 * (tsr_weight.role) is not the one its canonical name says (test_models runs
 * mixtures of experts through it). And as test_gemv_fused (TEST_GEMV_FUSED):
 * with prepare_group (matrices stacked by rows) and run_fused at every row
 * count (the input's RMSNorm, a gate/up pair's SiLU, the residual add, and
 * the fold of the next norm into the add and that product), in f64,
 * counting its calls (test_gemv_fused_calls), so that test_models runs the
 * host's fused forward pass on the CPU. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "slots/tsr_gemv.h"

/* A prepared matrix: the weight (its data the mapping's, or own's copy of
 * matrices stacked by prepare_group) and, for a stacked gate/up pair, the
 * rows of each. */
typedef struct handle {
    tsr_weight w;
    float *own;
    int64_t pair;
} handle;

typedef struct inst {
    const tsr_plugin_ctx *ctx;
    int64_t threads;
    /* the latest fold (tsr_gemv_fuse.fold_norm): where it wrote, its rows
     * and width, each row's sum of squares of the stream */
    const float *fold_out;
    int fold_rows;
    int64_t fold_cols;
    double *fold_ss;
} inst;

static int g_init(void *p, const tsr_plugin_ctx *ctx) {
    inst *g = p;
    g->ctx = ctx;
    const tsr_param *t = ctx->host->param(ctx, "threads");
    g->threads = t ? t->v.i : 0;
    return TSR_OK;
}

#ifdef TEST_GEMV_ROLES
static bool ends_with(const char *s, const char *end) {
    const size_t n = strlen(s), m = strlen(end);
    return n >= m && !strcmp(s + n - m, end);
}

/* The role a canonical (Hugging Face) tensor name implies. */
static tsr_weight_role role_by_name(const char *name) {
    if (strstr(name, ".experts.")) return TSR_WEIGHT_EXPERT;
    if (ends_with(name, ".mlp.gate.weight") || ends_with(name, ".block_sparse_moe.gate.weight") ||
        ends_with(name, ".mlp.shared_expert_gate.weight"))
        return TSR_WEIGHT_ROUTER;
    return TSR_WEIGHT_DENSE;
}
#endif

static int g_prepare(void *p, const tsr_weight *w, void **out) {
    inst *g = p;
#ifdef TEST_GEMV_ROLES
    const tsr_weight_role role = tsr_weight_role_of(g->ctx, w), want = role_by_name(w->name ? w->name : "");
    if (role != want) {
        g->ctx->host->set_error(g->ctx, "%s: role %d where its name says %d", w->name, (int)role, (int)want);
        return TSR_ERR_INVALID;
    }
#endif
#ifdef TEST_GEMV_V2
    if (w->dtype != TSR_DTYPE_F32 && w->dtype != TSR_DTYPE_F8_E4M3) {
#else
    if (w->dtype != TSR_DTYPE_F32) {
#endif
        g->ctx->host->set_error(g->ctx, "test_gemv reads f32 weights only");
        return TSR_ERR_UNSUPPORTED;
    }
    handle *h = g->ctx->host->alloc(g->ctx, sizeof *h, 16);
    if (!h) return TSR_ERR_NOMEM;
    *h = (handle){.w = *w};
    *out = h;
    return TSR_OK;
}

static void g_release(void *p, void *prepared) {
    inst *g = p;
    handle *h = prepared;
    if (h->own) g->ctx->host->free(g->ctx, h->own);
    g->ctx->host->free(g->ctx, h);
}

static int g_run(void *p, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    (void)p;
    (void)ex;
    const tsr_weight *w = &((const handle *)prepared)->w;
    const float *W = w->data;
    for (int r = 0; r < rows; r++)
        for (int64_t o = 0; o < w->rows; o++) {
            double acc = 0;
            for (int64_t i = 0; i < w->cols; i++) acc += (double)x[r * w->cols + i] * W[o * w->cols + i];
            y[r * w->rows + o] = (float)acc;
        }
    return TSR_OK;
}

#ifdef TEST_GEMV_FUSED
/* n f32 matrices of one width stacked by rows into the handle's copy. */
static int g_prepare_group(void *p, const tsr_weight *ws, int n, void **out) {
    inst *g = p;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        if (ws[i].dtype != TSR_DTYPE_F32 || ws[i].cols != ws[0].cols) return TSR_ERR_UNSUPPORTED;
        rows += ws[i].rows;
    }
    handle *h = g->ctx->host->alloc(g->ctx, sizeof *h, 16);
    float *data = g->ctx->host->alloc(g->ctx, (size_t)(rows * ws[0].cols) * sizeof *data, 64);
    if (!h || !data) {
        g->ctx->host->free(g->ctx, h), g->ctx->host->free(g->ctx, data);
        return TSR_ERR_NOMEM;
    }
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        memcpy(data + at * ws[0].cols, ws[i].data, (size_t)(ws[i].rows * ws[i].cols) * sizeof *data);
        at += ws[i].rows;
    }
    h->w = ws[0];
    h->w.rows = rows, h->w.data = data, h->w.nbytes = (uint64_t)(rows * ws[0].cols) * sizeof *data;
    h->own = data;
    h->pair = n == 2 && ws[0].rows == ws[1].rows ? ws[0].rows : 0;
    *out = h;
    return TSR_OK;
}

/* with a norm, a gate/up pair's SiLU, the add, a fold made, a fold used */
static atomic_long fused_calls[5];

static int g_run_fused(void *p, const void *prepared, int rows, const float *x, float *y, const tsr_gemv_fuse *fu,
                       const tsr_exec *ex) {
    (void)ex;
    inst *g = p;
    const tsr_weight *w = &((const handle *)prepared)->w;
    const int64_t f = fu->glu ? ((const handle *)prepared)->pair : w->rows, cols = w->cols; /* outputs */
    if (f == 0 || (fu->glu && fu->accumulate)) return TSR_ERR_UNSUPPORTED;
    if ((fu->fold_norm && (!fu->accumulate || fu->glu || fu->norm)) ||
        (fu->folded && (!fu->norm || x != g->fold_out || rows != g->fold_rows || cols != g->fold_cols)))
        return TSR_ERR_UNSUPPORTED;
    const float *W = w->data;
    double *xn = malloc((size_t)cols * sizeof *xn);
    if (!xn) return TSR_ERR_NOMEM;
    if (fu->fold_norm) {
        free(g->fold_ss);
        g->fold_out = NULL;
        if (!(g->fold_ss = malloc((size_t)rows * sizeof *g->fold_ss))) {
            free(xn);
            return TSR_ERR_NOMEM;
        }
    }
    for (int r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        double ss = 0;
        for (int64_t c = 0; c < cols; c++) ss += (double)xr[c] * xr[c];
        if (fu->folded) ss = g->fold_ss[r]; /* x is the stream times the norm's weights */
        const double inv = 1 / sqrt(ss / (double)cols + fu->eps);
        for (int64_t c = 0; c < cols; c++)
            xn[c] = fu->folded ? xr[c] * inv : fu->norm ? xr[c] * inv * fu->norm[c] : xr[c];
        for (int64_t o = 0; o < f; o++) {
            double a = 0, b = 0;
            for (int64_t c = 0; c < cols; c++) a += xn[c] * W[o * cols + c];
            if (fu->glu)
                for (int64_t c = 0; c < cols; c++) b += xn[c] * W[(f + o) * cols + c];
            const double v = fu->glu ? a / (1 + exp(-a)) * b : a;
            y[r * f + o] = fu->accumulate ? (float)(y[r * f + o] + v) : (float)v;
        }
        if (fu->fold_norm) { /* the stream after the add, for the next product */
            double s2 = 0;
            for (int64_t o = 0; o < f; o++) {
                const float v = y[r * f + o];
                s2 += (double)v * v;
                fu->fold_out[r * f + o] = v * fu->fold_norm[o];
            }
            g->fold_ss[r] = s2;
        }
    }
    free(xn);
    if (fu->fold_norm) g->fold_out = fu->fold_out, g->fold_rows = rows, g->fold_cols = f;
    if (fu->folded) g->fold_out = NULL; /* one use */
    if (fu->norm) atomic_fetch_add(&fused_calls[0], 1);
    if (fu->glu) atomic_fetch_add(&fused_calls[1], 1);
    if (fu->accumulate) atomic_fetch_add(&fused_calls[2], 1);
    if (fu->fold_norm) atomic_fetch_add(&fused_calls[3], 1);
    if (fu->folded) atomic_fetch_add(&fused_calls[4], 1);
    return TSR_OK;
}

/* run_fused's calls so far: kind 0 with a norm, 1 a gate/up pair's, 2 adds,
 * 3 folds made, 4 folds used. */
TSR_PLUGIN_EXPORT int64_t test_gemv_fused_calls(int32_t kind) {
    return kind >= 0 && kind < 5 ? (int64_t)atomic_load(&fused_calls[kind]) : -1;
}
#endif

static void g_fini(void *p) {
    inst *g = p;
    free(g->fold_ss);
}

static const tsr_gemv_i iface = {
    .struct_size = sizeof(tsr_gemv_i),
#ifdef TEST_GEMV_V2
    .version = 2, /* before scaled weights */
#else
    .version = TSR_GEMV_IFACE_VERSION,
#endif
    .prepare = g_prepare,
    .release = g_release,
    .run = g_run,
#ifdef TEST_GEMV_FUSED
    .prepare_group = g_prepare_group,
    .run_fused = g_run_fused,
#endif
};

static const tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
#ifdef TEST_GEMV_V2
    .name = "test_gemv_v2",
#elif defined TEST_GEMV_ROLES
    .name = "test_gemv_roles",
#elif defined TEST_GEMV_FUSED
    .name = "test_gemv_fused",
#else
    .name = "test_gemv",
#endif
    .slot = TSR_SLOT_GEMV,
    .version = "1.2.3",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = g_init,
    .fini = g_fini,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }

/* exports (pure functions) */
TSR_PLUGIN_EXPORT int32_t test_gemv_add_i32(int32_t a, int32_t b) { return a + b; }
TSR_PLUGIN_EXPORT int64_t test_gemv_mul_i64(int64_t a, int32_t b) { return a * b; }
TSR_PLUGIN_EXPORT double test_gemv_fma(double a, float b, double c) { return a * b + c; }
TSR_PLUGIN_EXPORT float test_gemv_half(float a) { return a / 2; }
TSR_PLUGIN_EXPORT int64_t test_gemv_strlen(const char *s) { return (int64_t)strlen(s); }
TSR_PLUGIN_EXPORT bool test_gemv_not(bool b) { return !b; }
TSR_PLUGIN_EXPORT uint64_t test_gemv_umax(uint64_t a, uint32_t b) { return a > b ? a : b; }
TSR_PLUGIN_EXPORT const char *test_gemv_parity(int32_t n) { return n % 2 ? "odd" : "even"; }
