/*
 * The decode kernels of cuda_gemv and cuda_gemv_fp8 (one row: whole rows
 * streamed by kernels/cuda/gemv_row.cuh, 1, 2 or 4 rows per warp and 1, 2
 * or 4 warps per row group by shape, or the tensor-core GEMV (every
 * configuration also checked against f64 by tools/cuda_lab/gemv_lab.cu on
 * wider rows); 2..8 rows: the tensor-core GEMV of
 * kernels/cuda/gemv_mma.cuh) through the plugins' run(), eagerly and
 * replayed from a CUDA graph (ctest label "gpu"; skipped cleanly where no
 * CUDA device is present). run_glu (one row of a stacked gate/up pair with
 * its SiLU in the GEMV's kernel) against run() followed by the core's
 * silu_mul_cat kernel: equal bit for bit, eagerly and from a graph.
 * run_experts (experts chosen by ids in device memory) against run_glu and
 * run of each chosen row alone: equal bit for bit, eagerly and from a
 * graph (cuda_gemv_fp8: its experts' one-row run() is gemv_row at every
 * height, checked against f64 here too). run_grouped (a prompt's rows
 * grouped by expert, both plugins: bf16 weights, and E4M3 codes widened in
 * the kernel) against f64 within bf16's bound. run_fused (the input's
 * RMSNorm and the residual add in the one-row product's launch) against
 * the core's norm kernel, run() and an add (fused_case).
 *
 * Weights are chosen so that both plugins hold them exactly: each is
 * s * (an E4M3 value) with s = 2^-6 and every row holds +-448 s, so that
 * cuda_gemv_fp8's scale max|w| / 448 is s and its codes are the values, and
 * bf16 represents every one. The reference is an f64 product. Bound, against
 * S = sum_c |w_c x_c|:
 *   |y - ref| <= REL * S + ABS * sum_c |w_c|
 * REL covers the rounding of the activations to the kernel's operand type
 * (bf16: 2^-9 relative; f16 after the 2^-4 scaling: 2^-11) and f32 sums; ABS
 * the f16 subnormal range (2^-21 absolute per element).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>

#include <cmocka.h>

#include "tests/gpu/gpu_env.h"

#include "core/host/engine.h"
#include "core/host/slot_calls.h"
#ifdef TESSERA_CUDA
#include "core/cuda/device.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

#ifdef TESSERA_CUDA

static uint32_t rng = 2463534242u;
static double urand(void) { /* [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return (rng >> 8) / 16777216.0;
}

static double e4m3_value(int code) { /* float8_e4m3fn by definition */
    int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

typedef struct env {
    tsr_engine *e;
    const tsr_slot_ref *gemv;
    tsr_exec ex;
    tsr_step *dev_step;
    double rel, abs;
} env;

static void env_open(env *v, const char *plugin) {
    char path[] = "/tmp/test_cuda_gemv_XXXXXX.yaml";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fprintf(f, "name: gemv\ndevice: cuda\nslots:\n  gemv: %s\n  attention: cuda_attention\n"
               "  kv_cache: cuda_kv_cache\n  drafter: drafter_none\n  expert_cache: expert_resident\n", plugin);
    fclose(f);
    /* its sizes bound the graph scratch: columns and outputs <= 2048 */
    tsr_model_desc md = {.arch = "llama", .n_layers = 1, .hidden = 2048, .n_heads = 4, .n_kv_heads = 2,
                         .head_dim = 16, .ffn = 2048, .vocab = 2048, .max_ctx = 128,
                         .weight_dtype = TSR_DTYPE_F32};
    tsr_engine_opts o = {.n_threads = 1};
    tsr_error err;
    tsr_error_clear(&err);
    int rc = tsr_engine_open(path, NULL, &md, &o, &v->e, &err);
    unlink(path);
    if (rc != TSR_OK) fail_msg("engine: %s", err.msg);
    v->gemv = tsr_engine_slot(v->e, TSR_SLOT_GEMV);
    v->ex = (tsr_exec){.device = TSR_DEVICE_CUDA, .stream = tsr_cuda_stream(), .n_threads = 1};
    v->dev_step = tsr_cuda_malloc(sizeof(tsr_step), &err);
    assert_non_null(v->dev_step);
    const int fp8 = strstr(plugin, "fp8") != NULL;
    v->rel = fp8 ? 0x1p-10 : 0x1p-8;
    v->abs = fp8 ? 0x1p-21 : 0;
}

/* What env_open made, given back. */
static void env_close(env *v) {
    tsr_cuda_free(v->dev_step);
    tsr_engine_free(v->e);
}

static void check(const env *v, const char *what, const float *w, const float *x, const float *y, int n_out,
                  int cols, int rows) {
    double worst = 0;
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) {
            double sum = 0, mag = 0, wabs = 0;
            for (int c = 0; c < cols; c++) {
                const double wv = w[(int64_t)o * cols + c], xv = x[(int64_t)r * cols + c];
                sum += wv * xv, mag += fabs(wv * xv), wabs += fabs(wv);
            }
            const double bound = v->rel * mag + v->abs * wabs + 1e-30, d = fabs(y[(int64_t)r * n_out + o] - sum);
            if (!(d <= bound))
                fail_msg("%s %s: rows %d, [%d x %d]: y[%d, %d] = %.9g, reference %.9g (|diff| %.3g > bound %.3g)",
                         v->gemv->plugin, what, rows, n_out, cols, r, o, y[(int64_t)r * n_out + o], sum, d, bound);
            if (d / bound > worst) worst = d / bound;
        }
    printf("# %s %s rows %d [%d x %d]: worst %.1f%% of the bound\n", v->gemv->plugin, what, rows, n_out, cols,
           100 * worst);
}

/* Weight names, for messages only: the role decides (an expert's matrix:
 * cuda_gemv_fp8 runs one row of those through gemv_row at every height, as
 * run_experts does; a router: held in bf16). Names that say nothing, so
 * that a plugin reading roles from names fails these cases. */
#define EXPERT_GATE "t.e1.gate"
#define EXPERT_UP "t.e1.up"
#define EXPERT_DOWN "t.e1.down"
#define ROUTER "t.r"
enum { PLAIN, EXPERT, ROUTER_W }; /* what gemv_case_as names its matrix */

/* n_out rows of cols weights that both plugins hold exactly (the header):
 * s times E4M3 values, each row holding +-448 s. */
static void fill_exact(float *w, int n_out, int cols) {
    const double s = 0x1p-6;
    for (int o = 0; o < n_out; o++) {
        for (int c = 0; c < cols; c++) {
            int code = (int)(urand() * 255);
            if ((code & 0x7f) == 0x7f) code &= 0xfe; /* no NaN */
            w[(int64_t)o * cols + c] = (float)(s * e4m3_value(code));
        }
        w[(int64_t)o * cols + (int)(urand() * cols)] = (float)(s * (urand() < 0.5 ? -448 : 448));
    }
}

/* rows of x through an [n_out, cols] matrix, eagerly, then (up to
 * TSR_GRAPH_MAX_ROWS rows) captured with ex->step set and replayed on new x.
 * kind: the matrix named as an expert's down projection (EXPERT) or a MoE
 * router (ROUTER_W: cuda_gemv_fp8 holds it in bf16, so cuda_gemv's bound). */
static void gemv_case_as(env *v, int kind, int n_out, int cols, int rows) {
    const int expert = kind == EXPERT;
    const double rel = v->rel, abs_ = v->abs;
    if (kind == ROUTER_W) v->rel = 0x1p-8, v->abs = 0;
    float *w = malloc(sizeof(float) * (size_t)n_out * cols), *x = malloc(sizeof(float) * (size_t)rows * cols);
    float *y = malloc(sizeof(float) * (size_t)rows * n_out);
    assert_true(w && x && y);
    fill_exact(w, n_out, cols);
    tsr_weight tw = {expert ? EXPERT_DOWN : kind == ROUTER_W ? ROUTER : "test.weight", TSR_DTYPE_F32, n_out, cols, w,
                     sizeof(float) * (uint64_t)n_out * cols, NULL,
                     expert ? TSR_WEIGHT_EXPERT : kind == ROUTER_W ? TSR_WEIGHT_ROUTER : TSR_WEIGHT_DENSE};
    void *h = NULL;
    int rc = tsr_gemv_prepare(v->gemv, &tw, &h);
    if (rc != TSR_OK) fail_msg("prepare: %d %s", rc, tsr_engine_plugin_error(v->e, TSR_SLOT_GEMV));
    tsr_error err;
    tsr_error_clear(&err);
    float *dx = tsr_cuda_malloc(sizeof(float) * (size_t)rows * cols, &err);
    float *dy = tsr_cuda_malloc(sizeof(float) * (size_t)rows * n_out, &err);
    assert_true(dx && dy);
    for (int pass = 0; pass < (rows <= TSR_GRAPH_MAX_ROWS ? 2 : 1); pass++) {
        for (int i = 0; i < rows * cols; i++) x[i] = (float)(urand() * 8 - 4);
        assert_int_equal(tsr_cuda_upload(dx, x, sizeof(float) * (size_t)rows * cols, &err), TSR_OK);
        if (pass == 0) {
            rc = tsr_gemv_run(v->gemv, h, rows, dx, dy, &v->ex);
        } else { /* captured once, replayed */
            tsr_exec ex = v->ex;
            ex.step = v->dev_step;
            void *graph = NULL;
            assert_int_equal(tsr_cuda_capture_begin(&err), TSR_OK);
            rc = tsr_gemv_run(v->gemv, h, rows, dx, dy, &ex);
            assert_int_equal(tsr_cuda_capture_end(&graph, &err), TSR_OK);
            if (rc == TSR_OK) assert_int_equal(tsr_cuda_graph_launch(graph, &err), TSR_OK);
            tsr_cuda_graph_free(graph);
        }
        if (rc != TSR_OK) fail_msg("run of %d rows: %d %s", rows, rc, tsr_engine_plugin_error(v->e, TSR_SLOT_GEMV));
        assert_int_equal(tsr_cuda_download(y, dy, sizeof(float) * (size_t)rows * n_out, &err), TSR_OK);
        static const char *const what[3][2] = {{"eager", "graph replay"},
                                               {"expert, eager", "expert, graph replay"},
                                               {"router, eager", "router, graph replay"}};
        check(v, what[kind][pass], w, x, y, n_out, cols, rows);
    }
    tsr_gemv_release(v->gemv, h);
    tsr_cuda_free(dx), tsr_cuda_free(dy);
    free(w), free(x), free(y);
    v->rel = rel, v->abs = abs_;
}

static void gemv_case(env *v, int n_out, int cols, int rows) { gemv_case_as(v, PLAIN, n_out, cols, rows); }

/* run_glu of rows rows through [gate; up] (f rows each, prepare_group)
 * against run() + the core's SiLU, bit for bit (want_fused), or refused
 * with TSR_ERR_UNSUPPORTED (not want_fused: shapes whose one-row GEMV is
 * not gemv_row's, where the host runs the two). One row goes through
 * gemv_row's GLU kernel, 2..8 through gemv_mma's; 9 rows (cuBLASLt) are
 * refused. */
static void glu_case_as(env *v, int expert, int f, int cols, int rows, int want_fused) {
    const int n = 2 * f;
    const size_t nx = (size_t)rows * cols, ny = (size_t)rows * f;
    float *w = malloc(sizeof(float) * (size_t)n * cols), *x = malloc(sizeof(float) * nx);
    float *want = malloc(sizeof(float) * ny), *got = malloc(sizeof(float) * ny);
    assert_true(w && x && want && got);
    for (int64_t i = 0; i < (int64_t)n * cols; i++) w[i] = (float)((urand() - 0.5) * 0x1p-3);
    const uint32_t role = expert ? TSR_WEIGHT_EXPERT : TSR_WEIGHT_DENSE;
    tsr_weight tw[2] = {{expert ? EXPERT_GATE : "blk.gate", TSR_DTYPE_F32, f, cols, w,
                         sizeof(float) * (uint64_t)f * cols, NULL, role},
                        {expert ? EXPERT_UP : "blk.up", TSR_DTYPE_F32, f, cols, w + (int64_t)f * cols,
                         sizeof(float) * (uint64_t)f * cols, NULL, role}};
    void *h = NULL, *h3 = NULL;
    tsr_weight three[3] = {tw[0], tw[1], tw[1]};
    assert_int_equal(tsr_gemv_prepare_group(v->gemv, tw, 2, &h), TSR_OK);
    assert_int_equal(tsr_gemv_prepare_group(v->gemv, three, 3, &h3), TSR_OK);
    tsr_error err;
    tsr_error_clear(&err);
    float *dx = tsr_cuda_malloc(sizeof(float) * nx, &err), *dgu = tsr_cuda_malloc(sizeof(float) * 2 * ny, &err);
    float *dy = tsr_cuda_malloc(sizeof(float) * ny, &err), *dg = tsr_cuda_malloc(sizeof(float) * ny, &err);
    assert_true(dx && dgu && dy && dg);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < nx; i++) x[i] = (float)(urand() * 16 - 8);
        assert_int_equal(tsr_cuda_upload(dx, x, sizeof(float) * nx, &err), TSR_OK);
        assert_int_equal(tsr_gemv_run(v->gemv, h, rows, dx, dgu, &v->ex), TSR_OK);
        assert_int_equal(tsr_cu_silu_mul_cat(dg, dgu, rows, f, 0, v->ex.stream), 0);
        assert_int_equal(tsr_cuda_download(want, dg, sizeof(float) * ny, &err), TSR_OK);
        assert_int_equal(tsr_gemv_run_glu(v->gemv, h3, rows, dx, dy, &v->ex), TSR_ERR_UNSUPPORTED);
        int rc;
        if (pass == 0) {
            rc = tsr_gemv_run_glu(v->gemv, h, rows, dx, dy, &v->ex);
        } else { /* captured once, replayed */
            tsr_exec ex = v->ex;
            ex.step = v->dev_step;
            void *graph = NULL;
            assert_int_equal(tsr_cuda_capture_begin(&err), TSR_OK);
            rc = tsr_gemv_run_glu(v->gemv, h, rows, dx, dy, &ex);
            assert_int_equal(tsr_cuda_capture_end(&graph, &err), TSR_OK);
            if (rc == TSR_OK) assert_int_equal(tsr_cuda_graph_launch(graph, &err), TSR_OK);
            tsr_cuda_graph_free(graph);
        }
        if (!want_fused) {
            assert_int_equal(rc, TSR_ERR_UNSUPPORTED);
            break;
        }
        if (rc != TSR_OK)
            fail_msg("run_glu %d rows [%d x %d]: %d %s", rows, n, cols, rc,
                     tsr_engine_plugin_error(v->e, TSR_SLOT_GEMV));
        assert_int_equal(tsr_cuda_download(got, dy, sizeof(float) * ny, &err), TSR_OK);
        for (size_t i = 0; i < ny; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                fail_msg("%s run_glu %d rows [%d x %d] %s: row %zu output %zu %.9g, run + silu %.9g", v->gemv->plugin,
                         rows, n, cols, pass ? "graph replay" : "eager", i / f, i % f, got[i], want[i]);
    }
    if (rows == 1) /* past the decode kernels: cuBLASLt, then the host's SiLU */
        assert_int_equal(tsr_gemv_run_glu(v->gemv, h, 9, dx, dy, &v->ex), TSR_ERR_UNSUPPORTED);
    printf("# %s run_glu %d rows [%d x %d]%s: %s\n", v->gemv->plugin, rows, n, cols, expert ? " (an expert's)" : "",
           want_fused ? "equal to run + silu" : "refused");
    tsr_gemv_release(v->gemv, h), tsr_gemv_release(v->gemv, h3);
    tsr_cuda_free(dx), tsr_cuda_free(dgu), tsr_cuda_free(dy), tsr_cuda_free(dg);
    free(w), free(x), free(want), free(got);
}

static void glu_case(env *v, int f, int cols, int rows, int want_fused) {
    glu_case_as(v, 0, f, cols, rows, want_fused);
}

/* run_fused (one row: the input's RMSNorm and the residual add in the
 * product's launch) on an [n_out, cols] matrix (glu: a [gate; up] pair of
 * n_out rows each) against the core's rmsnorm kernel, run() (run_glu:
 * run() and silu_mul_cat) and an f32 add: the add alone bit for bit; with
 * the norm within tol of S = sum_c |w_c xn_c| (the norm's factor applied to
 * the sums instead of each activation), eagerly and replayed from a graph.
 * want: whether the plugin takes it (else TSR_ERR_UNSUPPORTED, nothing
 * written). */
static void fused_case(env *v, int n_out, int cols, int norm, int acc, int glu, int want) {
    const int n = glu ? 2 * n_out : n_out, out = n_out; /* weight rows, outputs */
    const float eps = 1e-5f;
    float *w = malloc(sizeof(float) * (size_t)n * cols), *x = malloc(sizeof(float) * (size_t)cols);
    float *nw = malloc(sizeof(float) * (size_t)cols), *xn = malloc(sizeof(float) * (size_t)cols);
    float *y0 = malloc(sizeof(float) * (size_t)out), *prod = malloc(sizeof(float) * (size_t)n);
    float *want_y = malloc(sizeof(float) * (size_t)out), *got = malloc(sizeof(float) * (size_t)out);
    assert_true(w && x && nw && xn && y0 && prod && want_y && got);
    for (int64_t i = 0; i < (int64_t)n * cols; i++) w[i] = (float)((urand() - 0.5) * 0x1p-3);
    for (int c = 0; c < cols; c++) nw[c] = (float)(0.25 + urand() * 1.5);
    tsr_weight tw[2] = {{"blk.a", TSR_DTYPE_F32, n_out, cols, w, sizeof(float) * (uint64_t)n_out * cols, NULL,
                         TSR_WEIGHT_DENSE},
                        {"blk.b", TSR_DTYPE_F32, n_out, cols, w + (int64_t)n_out * cols,
                         sizeof(float) * (uint64_t)n_out * cols, NULL, TSR_WEIGHT_DENSE}};
    void *h = NULL;
    assert_int_equal(tsr_gemv_prepare_group(v->gemv, tw, glu ? 2 : 1, &h), TSR_OK);
    tsr_error err;
    tsr_error_clear(&err);
    float *dx = tsr_cuda_malloc(sizeof(float) * (size_t)cols, &err), *dxn = tsr_cuda_malloc(sizeof(float) * (size_t)cols, &err);
    float *dnw = tsr_cuda_malloc(sizeof(float) * (size_t)cols, &err), *dp = tsr_cuda_malloc(sizeof(float) * (size_t)n, &err);
    float *dy = tsr_cuda_malloc(sizeof(float) * (size_t)out, &err);
    assert_true(dx && dxn && dnw && dp && dy);
    assert_int_equal(tsr_cuda_upload(dnw, nw, sizeof(float) * (size_t)cols, &err), TSR_OK);
    const tsr_gemv_fuse fu = {.norm = norm ? dnw : NULL, .eps = eps, .glu = glu, .accumulate = acc};
    const double tol = strstr(v->gemv->plugin, "fp8") ? 0x1p-10 : 1e-5;
    double worst = 0;
    for (int pass = 0; pass < 2; pass++) {
        const double scale = pass ? 0.01 : 30; /* a residual stream of any size */
        for (int i = 0; i < cols; i++) x[i] = (float)((urand() - 0.5) * scale);
        for (int i = 0; i < out; i++) y0[i] = (float)(urand() * 4 - 2);
        assert_int_equal(tsr_cuda_upload(dx, x, sizeof(float) * (size_t)cols, &err), TSR_OK);
        /* the unfused ops: norm, product, SiLU */
        const float *in = dx;
        if (norm) assert_int_equal(tsr_cu_rmsnorm(dxn, dx, dnw, 1, cols, eps, 0, v->ex.stream), 0), in = dxn;
        assert_int_equal(tsr_gemv_run(v->gemv, h, 1, in, dp, &v->ex), TSR_OK);
        assert_int_equal(tsr_cuda_download(prod, dp, sizeof(float) * (size_t)n, &err), TSR_OK);
        if (glu) assert_int_equal(tsr_cu_silu_mul_cat(dp, dp, 1, n_out, 0, v->ex.stream), 0);
        assert_int_equal(tsr_cuda_download(want_y, dp, sizeof(float) * (size_t)out, &err), TSR_OK);
        assert_int_equal(tsr_cuda_download(xn, in, sizeof(float) * (size_t)cols, &err), TSR_OK);
        for (int i = 0; i < out && acc; i++) want_y[i] = y0[i] + want_y[i];
        assert_int_equal(tsr_cuda_upload(dy, y0, sizeof(float) * (size_t)out, &err), TSR_OK);
        int rc;
        if (pass == 0) {
            rc = tsr_gemv_run_fused(v->gemv, h, 1, dx, dy, &fu, &v->ex);
        } else { /* captured once, replayed */
            tsr_exec ex = v->ex;
            ex.step = v->dev_step;
            void *graph = NULL;
            assert_int_equal(tsr_cuda_capture_begin(&err), TSR_OK);
            rc = tsr_gemv_run_fused(v->gemv, h, 1, dx, dy, &fu, &ex);
            assert_int_equal(tsr_cuda_capture_end(&graph, &err), TSR_OK);
            if (rc == TSR_OK) assert_int_equal(tsr_cuda_graph_launch(graph, &err), TSR_OK);
            tsr_cuda_graph_free(graph);
        }
        assert_int_equal(tsr_cuda_download(got, dy, sizeof(float) * (size_t)out, &err), TSR_OK);
        if (!want) {
            assert_int_equal(rc, TSR_ERR_UNSUPPORTED);
            assert_memory_equal(got, y0, sizeof(float) * (size_t)out); /* nothing written */
            break;
        }
        if (rc != TSR_OK) fail_msg("run_fused [%d x %d]: %d %s", n, cols, rc, tsr_engine_plugin_error(v->e, TSR_SLOT_GEMV));
        assert_int_equal(tsr_gemv_run_fused(v->gemv, h, 2, dx, dy, &fu, &v->ex), TSR_ERR_UNSUPPORTED); /* one row */
        for (int o = 0; o < out; o++) {
            double bound = 0; /* bit for bit without the norm */
            if (norm) {
                double s[2] = {0, 0};
                for (int j = 0; j < (glu ? 2 : 1); j++)
                    for (int c = 0; c < cols; c++) s[j] += fabs((double)w[((int64_t)j * n_out + o) * cols + c] * xn[c]);
                if (!glu) {
                    bound = tol * s[0];
                } else { /* |d silu(g) / dg| < 1.1 */
                    const double g = prod[o], u = prod[n_out + o];
                    bound = tol * (1.1 * fabs(u) * s[0] + fabs(g / (1 + exp(-g))) * s[1]) + tol * tol * s[0] * s[1] * 1.1;
                }
            }
            const double d = fabs((double)got[o] - want_y[o]);
            if (!(d <= bound))
                fail_msg("%s run_fused%s%s%s [%d x %d] %s: y[%d] = %.9g, unfused %.9g (|diff| %.3g > %.3g)",
                         v->gemv->plugin, norm ? " norm" : "", acc ? " add" : "", glu ? " glu" : "", n, cols,
                         pass ? "graph replay" : "eager", o, got[o], want_y[o], d, bound);
            if (bound > 0 && d / bound > worst) worst = d / bound;
        }
    }
    printf("# %s run_fused%s%s%s [%d x %d]: %s (worst %.1f%% of the bound)\n", v->gemv->plugin, norm ? " norm" : "",
           acc ? " add" : "", glu ? " glu" : "", n, cols, want ? "as unfused" : "refused", 100 * worst);
    tsr_gemv_release(v->gemv, h);
    tsr_cuda_free(dx), tsr_cuda_free(dxn), tsr_cuda_free(dnw), tsr_cuda_free(dp), tsr_cuda_free(dy);
    free(w), free(x), free(nw), free(xn), free(y0), free(prod), free(want_y), free(got);
}

/* The fold (run_fused's fold_norm, then folded): a product into the stream
 * ([hidden, pcols], one row, added into y0) that also writes the stream
 * times the next norm's weights g, then the product after it ([n_next,
 * hidden]; glu: a [gate; up] pair) from that output, against run(), an f32
 * add, the core's rmsnorm kernel and run() (run_glu: and silu_mul_cat): the
 * stream bit for bit, the fold's output bit for bit the stream times g, the
 * product after within tol of S = sum_c |w_c xn_c| (the factor applied to
 * each sum); eagerly, then both calls captured in one graph and replayed on
 * new inputs. A folded call on another x, or the fold's output used twice,
 * is refused. want: whether the plugin folds (else the first call is
 * refused, nothing written). */
static void fold_case(env *v, int hidden, int pcols, int n_next, int glu, int want) {
    const int nc = glu ? 2 * n_next : n_next; /* the product after: weight rows */
    const float eps = 1e-5f;
    float *wp = malloc(sizeof(float) * (size_t)hidden * pcols), *wc = malloc(sizeof(float) * (size_t)nc * hidden);
    float *xin = malloc(sizeof(float) * (size_t)pcols), *g = malloc(sizeof(float) * (size_t)hidden);
    float *y0 = malloc(sizeof(float) * (size_t)hidden), *stream = malloc(sizeof(float) * (size_t)hidden);
    float *fo = malloc(sizeof(float) * (size_t)hidden), *xn = malloc(sizeof(float) * (size_t)hidden);
    float *prod = malloc(sizeof(float) * (size_t)nc), *want_z = malloc(sizeof(float) * (size_t)n_next);
    float *got = malloc(sizeof(float) * (size_t)n_next);
    assert_true(wp && wc && xin && g && y0 && stream && fo && xn && prod && want_z && got);
    for (int64_t i = 0; i < (int64_t)hidden * pcols; i++) wp[i] = (float)((urand() - 0.5) * 0x1p-3);
    for (int64_t i = 0; i < (int64_t)nc * hidden; i++) wc[i] = (float)((urand() - 0.5) * 0x1p-3);
    for (int c = 0; c < hidden; c++) g[c] = (float)(0.25 + urand() * 1.5);
    tsr_weight tp = {"blk.o", TSR_DTYPE_F32, hidden, pcols, wp, sizeof(float) * (uint64_t)hidden * pcols, NULL,
                     TSR_WEIGHT_DENSE};
    tsr_weight tc[2] = {{"blk.gate", TSR_DTYPE_F32, n_next, hidden, wc, sizeof(float) * (uint64_t)n_next * hidden,
                         NULL, TSR_WEIGHT_DENSE},
                        {"blk.up", TSR_DTYPE_F32, n_next, hidden, wc + (int64_t)n_next * hidden,
                         sizeof(float) * (uint64_t)n_next * hidden, NULL, TSR_WEIGHT_DENSE}};
    void *hp = NULL, *hc = NULL;
    assert_int_equal(tsr_gemv_prepare(v->gemv, &tp, &hp), TSR_OK);
    assert_int_equal(tsr_gemv_prepare_group(v->gemv, tc, glu ? 2 : 1, &hc), TSR_OK);
    tsr_error err;
    tsr_error_clear(&err);
    float *dxin = tsr_cuda_malloc(sizeof(float) * (size_t)pcols, &err), *dg = tsr_cuda_malloc(sizeof(float) * (size_t)hidden, &err);
    float *dy = tsr_cuda_malloc(sizeof(float) * (size_t)hidden, &err), *dfo = tsr_cuda_malloc(sizeof(float) * (size_t)hidden, &err);
    float *dxn = tsr_cuda_malloc(sizeof(float) * (size_t)hidden, &err), *dp = tsr_cuda_malloc(sizeof(float) * (size_t)nc, &err);
    float *dz = tsr_cuda_malloc(sizeof(float) * (size_t)n_next, &err);
    assert_true(dxin && dg && dy && dfo && dxn && dp && dz);
    assert_int_equal(tsr_cuda_upload(dg, g, sizeof(float) * (size_t)hidden, &err), TSR_OK);
    const tsr_gemv_fuse fp = {.accumulate = 1, .fold_norm = dg, .fold_out = dfo};
    const tsr_gemv_fuse fc = {.norm = dg, .eps = eps, .glu = glu, .folded = 1};
    double worst = 0;
    for (int pass = 0; pass < 2; pass++) {
        const double scale = pass ? 0.02 : 40; /* a residual stream of any size */
        for (int i = 0; i < pcols; i++) xin[i] = (float)((urand() - 0.5) * scale);
        for (int i = 0; i < hidden; i++) y0[i] = (float)((urand() - 0.5) * scale);
        assert_int_equal(tsr_cuda_upload(dxin, xin, sizeof(float) * (size_t)pcols, &err), TSR_OK);
        /* unfolded: run, add, norm, run (SiLU) */
        assert_int_equal(tsr_gemv_run(v->gemv, hp, 1, dxin, dy, &v->ex), TSR_OK);
        assert_int_equal(tsr_cuda_download(stream, dy, sizeof(float) * (size_t)hidden, &err), TSR_OK);
        for (int i = 0; i < hidden; i++) stream[i] = y0[i] + stream[i];
        assert_int_equal(tsr_cuda_upload(dy, stream, sizeof(float) * (size_t)hidden, &err), TSR_OK);
        assert_int_equal(tsr_cu_rmsnorm(dxn, dy, dg, 1, hidden, eps, 0, v->ex.stream), 0);
        assert_int_equal(tsr_cuda_download(xn, dxn, sizeof(float) * (size_t)hidden, &err), TSR_OK);
        assert_int_equal(tsr_gemv_run(v->gemv, hc, 1, dxn, dp, &v->ex), TSR_OK);
        assert_int_equal(tsr_cuda_download(prod, dp, sizeof(float) * (size_t)nc, &err), TSR_OK);
        if (glu) assert_int_equal(tsr_cu_silu_mul_cat(dp, dp, 1, n_next, 0, v->ex.stream), 0);
        assert_int_equal(tsr_cuda_download(want_z, dp, sizeof(float) * (size_t)n_next, &err), TSR_OK);
        /* folded */
        assert_int_equal(tsr_cuda_upload(dy, y0, sizeof(float) * (size_t)hidden, &err), TSR_OK);
        int rc, rc2 = TSR_OK;
        if (pass == 0) {
            rc = tsr_gemv_run_fused(v->gemv, hp, 1, dxin, dy, &fp, &v->ex);
            if (rc == TSR_OK) {
                /* the product after on another x: refused, the fold kept */
                assert_int_equal(tsr_gemv_run_fused(v->gemv, hc, 1, dxn, dz, &fc, &v->ex), TSR_ERR_UNSUPPORTED);
                rc2 = tsr_gemv_run_fused(v->gemv, hc, 1, dfo, dz, &fc, &v->ex);
            }
        } else { /* captured once, replayed */
            tsr_exec ex = v->ex;
            ex.step = v->dev_step;
            void *graph = NULL;
            assert_int_equal(tsr_cuda_capture_begin(&err), TSR_OK);
            rc = tsr_gemv_run_fused(v->gemv, hp, 1, dxin, dy, &fp, &ex);
            if (rc == TSR_OK) rc2 = tsr_gemv_run_fused(v->gemv, hc, 1, dfo, dz, &fc, &ex);
            assert_int_equal(tsr_cuda_capture_end(&graph, &err), TSR_OK);
            if (rc == TSR_OK && rc2 == TSR_OK) assert_int_equal(tsr_cuda_graph_launch(graph, &err), TSR_OK);
            tsr_cuda_graph_free(graph);
        }
        if (!want) {
            assert_int_equal(rc, TSR_ERR_UNSUPPORTED);
            assert_int_equal(tsr_cuda_download(stream, dy, sizeof(float) * (size_t)hidden, &err), TSR_OK);
            assert_memory_equal(stream, y0, sizeof(float) * (size_t)hidden); /* nothing written */
            break;
        }
        if (rc != TSR_OK || rc2 != TSR_OK)
            fail_msg("fold [%d x %d] then [%d x %d]: %d, %d %s", hidden, pcols, nc, hidden, rc, rc2,
                     tsr_engine_plugin_error(v->e, TSR_SLOT_GEMV));
        /* used once: a second use is refused */
        assert_int_equal(tsr_gemv_run_fused(v->gemv, hc, 1, dfo, dz, &fc, &v->ex), TSR_ERR_UNSUPPORTED);
        float *sy = malloc(sizeof(float) * (size_t)hidden);
        assert_non_null(sy);
        assert_int_equal(tsr_cuda_download(sy, dy, sizeof(float) * (size_t)hidden, &err), TSR_OK);
        assert_int_equal(tsr_cuda_download(fo, dfo, sizeof(float) * (size_t)hidden, &err), TSR_OK);
        for (int i = 0; i < hidden; i++) {
            if (memcmp(&sy[i], &stream[i], sizeof(float)))
                fail_msg("fold [%d x %d]: stream[%d] = %.9g, run and add %.9g", hidden, pcols, i, sy[i], stream[i]);
            const float want_fo = stream[i] * g[i];
            if (memcmp(&fo[i], &want_fo, sizeof(float)))
                fail_msg("fold [%d x %d]: out[%d] = %.9g, stream times g %.9g", hidden, pcols, i, fo[i], want_fo);
        }
        free(sy);
        assert_int_equal(tsr_cuda_download(got, dz, sizeof(float) * (size_t)n_next, &err), TSR_OK);
        const double tol = 1e-5;
        for (int o = 0; o < n_next; o++) {
            double sum[2] = {0, 0};
            for (int j = 0; j < (glu ? 2 : 1); j++)
                for (int c = 0; c < hidden; c++) sum[j] += fabs((double)wc[((int64_t)j * n_next + o) * hidden + c] * xn[c]);
            double bound = tol * sum[0];
            if (glu) { /* |d silu(g) / dg| < 1.1 */
                const double gv = prod[o], uv = prod[n_next + o];
                bound = tol * (1.1 * fabs(uv) * sum[0] + fabs(gv / (1 + exp(-gv))) * sum[1]) + tol * tol * sum[0] * sum[1] * 1.1;
            }
            const double d = fabs((double)got[o] - want_z[o]);
            if (!(d <= bound))
                fail_msg("%s folded%s [%d x %d] %s: z[%d] = %.9g, unfolded %.9g (|diff| %.3g > %.3g)", v->gemv->plugin,
                         glu ? " glu" : "", nc, hidden, pass ? "graph replay" : "eager", o, got[o], want_z[o], d, bound);
            if (d / bound > worst) worst = d / bound;
        }
    }
    printf("# %s fold [%d x %d] then%s [%d x %d]: %s (worst %.1f%% of the bound)\n", v->gemv->plugin, hidden, pcols,
           glu ? " glu" : "", nc, hidden, want ? "as unfolded" : "refused", 100 * worst);
    tsr_gemv_release(v->gemv, hp), tsr_gemv_release(v->gemv, hc);
    tsr_cuda_free(dxin), tsr_cuda_free(dg), tsr_cuda_free(dy), tsr_cuda_free(dfo), tsr_cuda_free(dxn);
    tsr_cuda_free(dp), tsr_cuda_free(dz);
    free(wp), free(wc), free(xin), free(g), free(y0), free(stream), free(fo), free(xn), free(prod), free(want_z);
    free(got);
}

/* run_experts over a table of E experts ([gate; up] pairs of f rows and
 * downs [cols, f]) for `tokens` rows of x with K choices each (some -1):
 * each chosen row against run_glu / run of that one row on the chosen
 * handle, bit for bit, eagerly and replayed from a graph; a -1 leaves its
 * row untouched. want: whether the plugin takes it (else
 * TSR_ERR_UNSUPPORTED for the tables). */
static void experts_case(env *v, int E, int f, int cols, int K, int tokens, int want) {
    const int n = tokens * K;
    void **gu = calloc((size_t)E, sizeof *gu), **dn = calloc((size_t)E, sizeof *dn);
    float *w = malloc(sizeof(float) * (size_t)2 * f * cols), *wd = malloc(sizeof(float) * (size_t)cols * f);
    assert_true(gu && dn && w && wd);
    for (int e = 0; e < E; e++) {
        for (int64_t i = 0; i < (int64_t)2 * f * cols; i++) w[i] = (float)((urand() - 0.5) * 0x1p-3);
        for (int64_t i = 0; i < (int64_t)cols * f; i++) wd[i] = (float)((urand() - 0.5) * 0x1p-3);
        tsr_weight tw[2] = {
            {EXPERT_GATE, TSR_DTYPE_F32, f, cols, w, sizeof(float) * (uint64_t)f * cols, NULL, TSR_WEIGHT_EXPERT},
            {EXPERT_UP, TSR_DTYPE_F32, f, cols, w + (int64_t)f * cols, sizeof(float) * (uint64_t)f * cols, NULL,
             TSR_WEIGHT_EXPERT}};
        tsr_weight td = {EXPERT_DOWN, TSR_DTYPE_F32, cols, f, wd, sizeof(float) * (uint64_t)cols * f, NULL,
                         TSR_WEIGHT_EXPERT};
        assert_int_equal(tsr_gemv_prepare_group(v->gemv, tw, 2, &gu[e]), TSR_OK);
        assert_int_equal(tsr_gemv_prepare(v->gemv, &td, &dn[e]), TSR_OK);
    }
    void *tgu = NULL, *tdn = NULL;
    int rc = tsr_gemv_prepare_experts(v->gemv, (const void *const *)gu, E, &tgu);
    if (!want) {
        assert_int_equal(rc, TSR_ERR_UNSUPPORTED);
        printf("# %s run_experts: declined\n", v->gemv->plugin);
    } else {
        assert_int_equal(rc, TSR_OK);
        assert_int_equal(tsr_gemv_prepare_experts(v->gemv, (const void *const *)dn, E, &tdn), TSR_OK);
        int32_t *sel = malloc(sizeof(int32_t) * (size_t)n);
        float *x = malloc(sizeof(float) * (size_t)tokens * cols), *want_g = malloc(sizeof(float) * (size_t)n * f),
              *want_d = malloc(sizeof(float) * (size_t)n * cols), *got = malloc(sizeof(float) * (size_t)n * f * cols);
        assert_true(sel && x && want_g && want_d && got);
        for (int j = 0; j < n; j++) sel[j] = j % 5 == 3 ? -1 : (int)(urand() * E);
        for (int i = 0; i < tokens * cols; i++) x[i] = (float)(urand() * 8 - 4);
        tsr_error err;
        tsr_error_clear(&err);
        float *dx = tsr_cuda_malloc(sizeof(float) * (size_t)tokens * cols, &err);
        float *dg = tsr_cuda_malloc(sizeof(float) * (size_t)n * f, &err);
        float *dd = tsr_cuda_malloc(sizeof(float) * (size_t)n * cols, &err);
        int32_t *dsel = tsr_cuda_malloc(sizeof(int32_t) * (size_t)n, &err);
        assert_true(dx && dg && dd && dsel);
        assert_int_equal(tsr_cuda_upload(dx, x, sizeof(float) * (size_t)tokens * cols, &err), TSR_OK);
        assert_int_equal(tsr_cuda_upload(dsel, sel, sizeof(int32_t) * (size_t)n, &err), TSR_OK);
        /* one row at a time through run_glu and run: the reference; a
         * skipped row keeps the 0 written here */
        assert_int_equal(cudaMemset(dg, 0, sizeof(float) * (size_t)n * f), 0);
        assert_int_equal(cudaMemset(dd, 0, sizeof(float) * (size_t)n * cols), 0);
        for (int j = 0; j < n; j++) {
            if (sel[j] < 0) continue;
            assert_int_equal(tsr_gemv_run_glu(v->gemv, gu[sel[j]], 1, dx + (int64_t)(j / K) * cols,
                                              dg + (int64_t)j * f, &v->ex), TSR_OK);
            assert_int_equal(tsr_gemv_run(v->gemv, dn[sel[j]], 1, dg + (int64_t)j * f, dd + (int64_t)j * cols,
                                          &v->ex), TSR_OK);
        }
        assert_int_equal(tsr_cuda_download(want_g, dg, sizeof(float) * (size_t)n * f, &err), TSR_OK);
        assert_int_equal(tsr_cuda_download(want_d, dd, sizeof(float) * (size_t)n * cols, &err), TSR_OK);
        for (int pass = 0; pass < 2; pass++) {
            assert_int_equal(cudaMemset(dg, 0, sizeof(float) * (size_t)n * f), 0);
            assert_int_equal(cudaMemset(dd, 0, sizeof(float) * (size_t)n * cols), 0);
            tsr_exec ex = v->ex;
            void *graph = NULL;
            if (pass) ex.step = v->dev_step, assert_int_equal(tsr_cuda_capture_begin(&err), TSR_OK);
            int r1 = tsr_gemv_run_experts(v->gemv, tgu, dsel, n, K, 1, dx, cols, dg, &ex);
            int r2 = tsr_gemv_run_experts(v->gemv, tdn, dsel, n, 1, 0, dg, f, dd, &ex);
            if (pass) {
                assert_int_equal(tsr_cuda_capture_end(&graph, &err), TSR_OK);
                if (r1 == TSR_OK && r2 == TSR_OK) assert_int_equal(tsr_cuda_graph_launch(graph, &err), TSR_OK);
                tsr_cuda_graph_free(graph);
            }
            if (r1 != TSR_OK || r2 != TSR_OK)
                fail_msg("run_experts: %d %d %s", r1, r2, tsr_engine_plugin_error(v->e, TSR_SLOT_GEMV));
            assert_int_equal(tsr_cuda_download(got, dg, sizeof(float) * (size_t)n * f, &err), TSR_OK);
            if (memcmp(got, want_g, sizeof(float) * (size_t)n * f) != 0)
                fail_msg("run_experts gate/up [%d x %d] differs from run_glu row by row (%s)", 2 * f, cols,
                         pass ? "graph" : "eager");
            assert_int_equal(tsr_cuda_download(got, dd, sizeof(float) * (size_t)n * cols, &err), TSR_OK);
            if (memcmp(got, want_d, sizeof(float) * (size_t)n * cols) != 0)
                fail_msg("run_experts down [%d x %d] differs from run row by row (%s)", cols, f,
                         pass ? "graph" : "eager");
        }
        /* a row count the kernel's grid cannot take */
        assert_int_equal(tsr_gemv_run_experts(v->gemv, tgu, dsel, 70000, K, 1, dx, cols, dg, &v->ex),
                         TSR_ERR_UNSUPPORTED);
        printf("# %s run_experts: %d experts, [%d x %d] pairs and [%d x %d] downs, %d rows x %d choices: equal to "
               "run_glu / run row by row, eager and replayed\n",
               v->gemv->plugin, E, 2 * f, cols, cols, f, tokens, K);
        tsr_gemv_release_experts(v->gemv, tdn);
        tsr_cuda_free(dx), tsr_cuda_free(dg), tsr_cuda_free(dd), tsr_cuda_free(dsel);
        free(sel), free(x), free(want_g), free(want_d), free(got);
    }
    tsr_gemv_release_experts(v->gemv, tgu);
    void *odd = NULL; /* experts of unequal shapes: refused */
    if (want) {
        void *two[2] = {gu[0], dn[0]};
        assert_int_equal(tsr_gemv_prepare_experts(v->gemv, (const void *const *)two, 2, &odd), TSR_ERR_INVALID);
    }
    for (int e = 0; e < E; e++) tsr_gemv_release(v->gemv, gu[e]), tsr_gemv_release(v->gemv, dn[e]);
    free(gu), free(dn), free(w), free(wd);
}

/* run_grouped: a prompt's rows grouped by expert (counts[e] rows of expert
 * e, some 0, some past a 64-row tile) through E experts' [gate; up] pairs
 * of f rows each and downs [cols, f]: the pair as 2f plain outputs and the
 * downs against f64 row by row (the bound above: bf16 activations), the
 * pair with its SiLU against silu(gate) * up of those plain outputs.
 * want: whether the plugin takes it (else TSR_ERR_UNSUPPORTED). Weights
 * held exactly by both plugins (fill_exact); both round the activations
 * to bf16 (cuda_gemv_fp8 as its prefill tiles do), so bf16's bound. */
static void grouped_case(env *v, int E, int f, int cols, const int *counts, int want) {
    const double rel = v->rel, abs_ = v->abs;
    v->rel = 0x1p-8, v->abs = 0;
    int32_t off[17] = {0};
    assert_true(E <= 16);
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    const int n = off[E], wide = cols > f ? cols : f;
    float *wgu = malloc(sizeof(float) * (size_t)E * 2 * f * cols), *wd = malloc(sizeof(float) * (size_t)E * cols * f);
    float *x = malloc(sizeof(float) * (size_t)n * cols), *y = malloc(sizeof(float) * (size_t)n * 2 * wide);
    float *yg = malloc(sizeof(float) * (size_t)n * f);
    void **gu = calloc((size_t)E, sizeof *gu), **dn = calloc((size_t)E, sizeof *dn);
    assert_true(wgu && wd && x && y && yg && gu && dn);
    fill_exact(wgu, E * 2 * f, cols);
    fill_exact(wd, E * cols, f);
    for (int64_t i = 0; i < (int64_t)n * cols; i++) x[i] = (float)(urand() * 4 - 2);
    for (int e = 0; e < E; e++) {
        const float *g = wgu + (int64_t)e * 2 * f * cols;
        tsr_weight tw[2] = {
            {EXPERT_GATE, TSR_DTYPE_F32, f, cols, g, sizeof(float) * (uint64_t)f * cols, NULL, TSR_WEIGHT_EXPERT},
            {EXPERT_UP, TSR_DTYPE_F32, f, cols, g + (int64_t)f * cols, sizeof(float) * (uint64_t)f * cols, NULL,
             TSR_WEIGHT_EXPERT}};
        tsr_weight td = {EXPERT_DOWN, TSR_DTYPE_F32, cols, f, wd + (int64_t)e * cols * f,
                         sizeof(float) * (uint64_t)cols * f, NULL, TSR_WEIGHT_EXPERT};
        assert_int_equal(tsr_gemv_prepare_group(v->gemv, tw, 2, &gu[e]), TSR_OK);
        assert_int_equal(tsr_gemv_prepare(v->gemv, &td, &dn[e]), TSR_OK);
    }
    void *tgu = NULL, *tdn = NULL;
    assert_int_equal(tsr_gemv_prepare_experts(v->gemv, (const void *const *)gu, E, &tgu), TSR_OK);
    assert_int_equal(tsr_gemv_prepare_experts(v->gemv, (const void *const *)dn, E, &tdn), TSR_OK);
    tsr_error err;
    tsr_error_clear(&err);
    float *dx = tsr_cuda_malloc(sizeof(float) * (size_t)n * cols, &err);
    float *dy = tsr_cuda_malloc(sizeof(float) * (size_t)n * 2 * wide, &err);
    assert_true(dx && dy);
    assert_int_equal(tsr_cuda_upload(dx, x, sizeof(float) * (size_t)n * cols, &err), TSR_OK);
    int rc = tsr_gemv_run_grouped(v->gemv, tgu, off, E, 0, dx, cols, dy, &v->ex);
    if (!want) {
        assert_int_equal(rc, TSR_ERR_UNSUPPORTED);
        printf("# %s run_grouped: declined\n", v->gemv->plugin);
    } else {
        if (rc != TSR_OK) fail_msg("run_grouped: %d %s", rc, tsr_engine_plugin_error(v->e, TSR_SLOT_GEMV));
        assert_int_equal(tsr_cuda_download(y, dy, sizeof(float) * (size_t)n * 2 * f, &err), TSR_OK);
        for (int e = 0; e < E; e++)
            if (counts[e])
                check(v, "grouped [gate; up]", wgu + (int64_t)e * 2 * f * cols, x + (int64_t)off[e] * cols,
                      y + (int64_t)off[e] * 2 * f, 2 * f, cols, counts[e]);
        assert_int_equal(tsr_gemv_run_grouped(v->gemv, tgu, off, E, 1, dx, cols, dy, &v->ex), TSR_OK);
        assert_int_equal(tsr_cuda_download(yg, dy, sizeof(float) * (size_t)n * f, &err), TSR_OK);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < f; i++) {
                const double gt = y[(int64_t)r * 2 * f + i], ut = y[(int64_t)r * 2 * f + f + i];
                const double want_v = gt / (1 + exp(-gt)) * ut, got = yg[(int64_t)r * f + i];
                if (!(fabs(got - want_v) <= 1e-5 * fabs(want_v) + 1e-30))
                    fail_msg("run_grouped glu row %d output %d: %.9g, silu(gate) * up of its outputs %.9g", r, i, got,
                             want_v);
            }
        /* the downs, over the SiLU outputs */
        float *dg = tsr_cuda_malloc(sizeof(float) * (size_t)n * f, &err);
        assert_non_null(dg);
        assert_int_equal(tsr_cuda_upload(dg, yg, sizeof(float) * (size_t)n * f, &err), TSR_OK);
        assert_int_equal(tsr_gemv_run_grouped(v->gemv, tdn, off, E, 0, dg, f, dy, &v->ex), TSR_OK);
        assert_int_equal(tsr_cuda_download(y, dy, sizeof(float) * (size_t)n * cols, &err), TSR_OK);
        for (int e = 0; e < E; e++)
            if (counts[e])
                check(v, "grouped down", wd + (int64_t)e * cols * f, yg + (int64_t)off[e] * f,
                      y + (int64_t)off[e] * cols, cols, f, counts[e]);
        /* offsets that go down: refused, nothing done (x is converted to
         * bf16 before the products, so any alignment of it is taken) */
        if (E > 1) {
            int32_t bad[17];
            memcpy(bad, off, sizeof bad);
            bad[1] = off[2] + 1;
            assert_int_equal(tsr_gemv_run_grouped(v->gemv, tgu, bad, E, 0, dx, cols, dy, &v->ex), TSR_ERR_UNSUPPORTED);
        }
        printf("# %s run_grouped: %d experts, %d rows, [%d x %d] pairs (plain and with SiLU), [%d x %d] downs\n",
               v->gemv->plugin, E, n, 2 * f, cols, cols, f);
        tsr_cuda_free(dg);
    }
    tsr_gemv_release_experts(v->gemv, tgu);
    tsr_gemv_release_experts(v->gemv, tdn);
    for (int e = 0; e < E; e++) tsr_gemv_release(v->gemv, gu[e]), tsr_gemv_release(v->gemv, dn[e]);
    tsr_cuda_free(dx), tsr_cuda_free(dy);
    free(wgu), free(wd), free(x), free(y), free(yg), free(gu), free(dn);
    v->rel = rel, v->abs = abs_;
}

static void plugin_cases(const char *plugin) {
    env v;
    env_open(&v, plugin);
    for (int rows = 1; rows <= 8; rows++) {
        gemv_case(&v, 37, 256, rows);  /* a partial row tile */
        gemv_case(&v, 130, 1000, rows); /* rows not a multiple of the units */
    }
    /* stories260K's matrices (q/k/v stacked, o, gate/up stacked, down, the
     * LM head) at every verification row count: test_cuda's drafting case
     * finds a wrong token through cuda_gemv at its 8-row pass (BENCHMARKS.md,
     * thirty-fifth session) */
    static const int stories[][2] = {{128, 64}, {64, 64}, {344, 64}, {64, 172}, {512, 64}};
    for (int rows = 2; rows <= 8; rows++)
        for (size_t i = 0; i < sizeof stories / sizeof stories[0]; i++)
            gemv_case(&v, stories[i][0], stories[i][1], rows);
    gemv_case(&v, 1000, 1000, 1);
    gemv_case(&v, 16, 4, 2);  /* one unit, mostly padding */
    gemv_case(&v, 33, 12, 1); /* one row, width not a multiple of 64 */
    /* one row at each of gemv_row.cuh's choices by height, partial warps and
     * blocks, widths a multiple of 16 but not of 64 (padded rows) */
    gemv_case(&v, 16390, 80, 1);
    gemv_case(&v, 5001, 48, 1);
    gemv_case(&v, 4093, 208, 1);
    /* E4M3 rows hold whole 512-column steps permuted (gemv_mma.cuh): three
     * steps and a 16-column tail, one row and the tensor-core rows */
    gemv_case(&v, 77, 1552, 1);
    gemv_case(&v, 77, 1552, 5);
    gemv_case(&v, 2000, 1024, 1);
    gemv_case(&v, 5003, 1040, 1);
    gemv_case(&v, 16390, 1024, 1);
    /* E4M3 verification rows on tall matrices: several row tiles a warp
     * (gemv_mma.cuh tiles_for: 2 from 6,144 rows, 4 from 16,384), partial */
    for (int rows = 2; rows <= 8; rows += 3) {
        gemv_case(&v, 6200, 1552, rows);
        gemv_case(&v, 16390, 1040, rows);
    }
    /* prefill rows through a matrix of more than 64 MiB of bf16 (cuda_gemv_fp8's
     * eager tiles: two of them) */
    gemv_case(&v, 16400, 2048, TSR_GRAPH_MAX_ROWS + 8);
    /* run_glu at each of launch_glu's configurations by height, partial
     * blocks; E4M3 verification rows through gemv_mma's GLU kernel (one,
     * two and four tiles a warp by height, gemv_mma.cuh tiles_for), which
     * cuda_gemv refuses (slower in bf16) */
    const int fp8 = strstr(plugin, "fp8") != NULL;
    glu_case(&v, 999, 256, 1, !fp8); /* E4M3: gemv_mma's height, refused at one row */
    glu_case(&v, 2501, 1040, 1, 1);
    glu_case(&v, 2501, 80, 1, 1);
    glu_case(&v, 8195, 64, 1, 1);
    for (int rows = 2; rows <= 8; rows += 3) {
        glu_case(&v, 999, 256, rows, fp8);
        glu_case(&v, 3100, 1040, rows, fp8);
        glu_case(&v, 8195, 1552, rows, fp8);
    }
    /* run_fused: the add through either kernel; the norm in E4M3 below
     * 16,384 rows through gemv_row or (tiles, above 4,096 rows) gemv_tile
     * (gemv_row.cuh fused_takes), and into an E4M3 gate/up pair at one row
     * where gemv_row stages its activations (stages_x; not at gemv_mma's
     * heights, not with an add) */
    fused_case(&v, 1000, 1040, 0, 1, 0, 1);
    fused_case(&v, 5003, 1040, 0, 1, 0, 1);
    fused_case(&v, 5003, 1040, 1, 0, 0, fp8);
    fused_case(&v, 5003, 1552, 1, 1, 0, fp8);
    fused_case(&v, 6150, 80, 1, 0, 0, fp8);
    fused_case(&v, 16390, 1024, 1, 0, 0, 0);
    fused_case(&v, 1000, 1040, 1, 0, 0, 0);
    fused_case(&v, 2501, 1040, 1, 0, 1, fp8);
    fused_case(&v, 8195, 80, 1, 0, 1, fp8);
    fused_case(&v, 999, 1040, 1, 0, 1, 0);
    fused_case(&v, 2501, 1040, 1, 1, 1, 0);
    fused_case(&v, 2501, 1040, 0, 1, 1, 0);
    /* the fold (gemv_row.cuh fold_blocks, folded_takes): bf16 only; the
     * product into the stream in row groups of 4 warps (1,024 sums: the
     * most) and of 2 (512, and 513 with a partial block), the product after
     * plain (groups of 4 warps: 3,000 and 17,000 rows; of 2: 1,000) and a
     * gate/up pair; refused where the sums are too many (2,048) */
    fold_case(&v, 2048, 1040, 3000, 0, !fp8);
    fold_case(&v, 4096, 4096, 5000, 1, !fp8);
    fold_case(&v, 4096, 4096, 17000, 0, !fp8);
    fold_case(&v, 4104, 2056, 1000, 0, !fp8);
    fold_case(&v, 4104, 2056, 1000, 1, !fp8);
    fold_case(&v, 4096, 1024, 1000, 0, 0);
    /* an expert's matrices: gemv_row at any height for one row in E4M3
     * (run_experts' sums), against f64 and run + silu; gemv_mma above */
    gemv_case_as(&v, EXPERT, 37, 256, 1);
    gemv_case_as(&v, EXPERT, 2000, 1552, 1);
    gemv_case_as(&v, EXPERT, 77, 1040, 3);
    /* a router: cuda_gemv_fp8 holds it in bf16 (decode, and prefill rows
     * through its bf16 tiles' GEMM), within bf16's bound */
    for (int rows = 1; rows <= 24; rows += rows < 3 ? 1 : 7) gemv_case_as(&v, ROUTER_W, 60, 2048, rows);
    gemv_case_as(&v, ROUTER_W, 8, 1000, 1); /* columns not a multiple of 8: x padded first */
    glu_case_as(&v, 1, 999, 256, 1, 1);
    glu_case_as(&v, 1, 24, 80, 1, 1);
    glu_case_as(&v, 1, 24, 80, 3, fp8);
    /* experts chosen on the device */
    experts_case(&v, 6, 384, 256, 4, 3, 1);
    experts_case(&v, 3, 208, 1040, 2, 1, 1);
    experts_case(&v, 3, 200, 1000, 2, 1, !fp8); /* E4M3 rows of 1,000 columns: gemv_row reads 16 at a time */
    /* a prompt's rows grouped by expert */
    const int counts_a[] = {3, 0, 70, 64, 1, 129};
    grouped_case(&v, 6, 96, 256, counts_a, 1);
    const int counts_b[] = {17, 5, 0};
    /* partial tiles of outputs and of columns (E4M3: experts' rows a multiple
     * of 16 wide, two whole 512-column steps and a tail) */
    grouped_case(&v, 3, fp8 ? 208 : 200, fp8 ? 1040 : 1000, counts_b, 1);
    env_close(&v);
}
/* cuda_gemv_cublaslt (and cuda_gemv above 8 rows): cuBLASLt plans shared by
 * the row counts of a bucket (16, then powers of two), each count against
 * the f64 product: counts in one bucket in turn, up and down, on two shapes. */
static void lt_cases(const char *plugin) {
    env v;
    env_open(&v, plugin);
    const int counts[] = {20, 17, 31, 1, 9, 16, 64, 50, 33, 200, 130, 256, 129, 300};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        gemv_case(&v, 130, 1000, counts[i]);
        gemv_case(&v, 2000, 1024, counts[i]);
    }
    env_close(&v);
}

/* D[m x n] (f32, column-major) = W^T-view x X-view by the algorithm that
 * cuBLASLt's heuristic ranks first for the query the plugin makes (bf16 x
 * bf16 -> f32, f32 compute, 32 MiB workspace): w [m, k] and x [n, k]
 * row-major bf16 on the device. */
static void lt_first_choice(const void *w, const void *x, float *d, int m, int n, int k, void *ws) {
    cublasLtHandle_t lt;
    assert_int_equal(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    assert_int_equal(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    assert_int_equal(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreference_t pref;
    size_t wsb = 32u << 20;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    assert_int_equal(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &res, &found),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(found, 1);
    const float one = 1.0f, zero = 0.0f;
    assert_int_equal(cublasLtMatmul(lt, op, &one, w, la, x, lb, &zero, d, ld, d, ld, &res.algo, ws, wsb,
                                    (cudaStream_t)tsr_cuda_stream()),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaStreamSynchronize((cudaStream_t)tsr_cuda_stream()), cudaSuccess);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
}

/* A prompt-sized product (rows >= 128: the plugin times cuBLASLt's
 * candidates) equals the heuristic's first choice bit for bit: a faster
 * candidate that sums in another order is not taken, so two processes of
 * one assembly compute the same prompt. Weights and activations are
 * bf16 values, so the plugin's rounding to bf16 is exact. */
static void lt_choice_case(const char *plugin, int m, int k, int n) {
    env v;
    env_open(&v, plugin);
    float *w = malloc(sizeof(float) * (size_t)m * k), *x = malloc(sizeof(float) * (size_t)n * k);
    uint16_t *wb = malloc(2 * (size_t)m * k), *xb = malloc(2 * (size_t)n * k);
    float *y = malloc(sizeof(float) * (size_t)n * m), *ref = malloc(sizeof(float) * (size_t)n * m);
    assert_true(w && x && wb && xb && y && ref);
    fill_exact(w, m, k);
    for (size_t i = 0; i < (size_t)m * k; i++) wb[i] = tsr_f32_to_bf16(w[i]);
    for (size_t i = 0; i < (size_t)n * k; i++) x[i] = tsr_bf16_to_f32(xb[i] = tsr_f32_to_bf16((float)(urand() * 8 - 4)));
    tsr_weight tw = {"test.weight", TSR_DTYPE_F32, m, k, w, sizeof(float) * (uint64_t)m * k, NULL, TSR_WEIGHT_DENSE};
    void *h = NULL;
    int rc = tsr_gemv_prepare(v.gemv, &tw, &h);
    if (rc != TSR_OK) fail_msg("prepare: %d %s", rc, tsr_engine_plugin_error(v.e, TSR_SLOT_GEMV));
    tsr_error err;
    tsr_error_clear(&err);
    float *dx = tsr_cuda_malloc(sizeof(float) * (size_t)n * k, &err), *dy = tsr_cuda_malloc(sizeof(float) * (size_t)n * m, &err);
    void *dwb = tsr_cuda_malloc(2 * (size_t)m * k, &err), *dxb = tsr_cuda_malloc(2 * (size_t)n * k, &err);
    void *ws = tsr_cuda_malloc(32u << 20, &err);
    assert_true(dx && dy && dwb && dxb && ws);
    assert_int_equal(tsr_cuda_upload(dx, x, sizeof(float) * (size_t)n * k, &err), TSR_OK);
    assert_int_equal(tsr_cuda_upload(dwb, wb, 2 * (size_t)m * k, &err), TSR_OK);
    assert_int_equal(tsr_cuda_upload(dxb, xb, 2 * (size_t)n * k, &err), TSR_OK);
    rc = tsr_gemv_run(v.gemv, h, n, dx, dy, &v.ex);
    if (rc != TSR_OK) fail_msg("run of %d rows: %d %s", n, rc, tsr_engine_plugin_error(v.e, TSR_SLOT_GEMV));
    assert_int_equal(tsr_cuda_download(y, dy, sizeof(float) * (size_t)n * m, &err), TSR_OK);
    lt_first_choice(dwb, dxb, dy, m, n, k, ws);
    assert_int_equal(tsr_cuda_download(ref, dy, sizeof(float) * (size_t)n * m, &err), TSR_OK);
    size_t differ = 0;
    for (size_t i = 0; i < (size_t)n * m; i++) differ += memcmp(&y[i], &ref[i], sizeof(float)) != 0;
    if (differ) fail_msg("%s [%d x %d] at %d rows: %zu of %zu outputs differ from cuBLASLt's first choice", plugin,
                         m, k, n, differ, (size_t)n * m);
    printf("# %s [%d x %d] at %d rows: equal to cuBLASLt's first choice bit for bit\n", plugin, m, k, n);
    tsr_gemv_release(v.gemv, h);
    tsr_cuda_free(dx), tsr_cuda_free(dy), tsr_cuda_free(dwb), tsr_cuda_free(dxb), tsr_cuda_free(ws);
    free(w), free(x), free(wb), free(xb), free(y), free(ref);
    env_close(&v);
}
#endif

static void test_decode_kernels(void **state) {
    (void)state;
    GPU_REQUIRE("decode gemv checks");
#ifdef TESSERA_CUDA
    plugin_cases("cuda_gemv");
    plugin_cases("cuda_gemv_fp8");
#endif
}

/* cuda_gemv_fp8 with param tile_all (gate/up pairs in pair tiles: 8 gate
 * rows, then their 8 up rows, a tile; every plain matrix in tiles): run_glu at one row through
 * gemv_tile at any height and at 2..8 rows through gemv_mma's GLU kernel
 * over the tiles, each run() (over the same tiles, outputs put back in
 * stacked order) and the SiLU bit for bit; the input norm into a pair at
 * one row (gemv_tile's staged norm) within the fused bound, refused with an
 * add. */
static void test_pair_tiles(void **state) {
    (void)state;
    GPU_REQUIRE("pair tile checks");
#ifdef TESSERA_CUDA
    env v;
    env_open(&v, "{plugin: cuda_gemv_fp8, params: {tile_all: true}}");
    glu_case(&v, 999, 256, 1, 1);
    glu_case(&v, 2501, 1040, 1, 1);
    glu_case(&v, 8195, 64, 1, 1);
    for (int rows = 2; rows <= 8; rows += 3) {
        glu_case(&v, 999, 256, rows, 1);
        glu_case(&v, 3100, 1040, rows, 1);
        glu_case(&v, 8195, 1552, rows, 1);
    }
    fused_case(&v, 999, 1040, 1, 0, 1, 1);
    fused_case(&v, 8195, 80, 1, 0, 1, 1);
    fused_case(&v, 2501, 1040, 1, 1, 1, 0);
    env_close(&v);
#endif
}

static void test_cublaslt_plans(void **state) {
    (void)state;
    GPU_REQUIRE("cuBLASLt plan checks");
#ifdef TESSERA_CUDA
    lt_cases("cuda_gemv_cublaslt");
    lt_cases("cuda_gemv");
    /* Llama-3-8B's shapes (q, gate, down) at a 512-token prompt */
    static const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
    for (int i = 0; i < 3; i++) {
        lt_choice_case("cuda_gemv_cublaslt", shapes[i][0], shapes[i][1], 512);
        lt_choice_case("cuda_gemv", shapes[i][0], shapes[i][1], 512);
    }
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_decode_kernels), cmocka_unit_test(test_pair_tiles),
                                       cmocka_unit_test(test_cublaslt_plans)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
