#include "gemv_engine.h"

#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <stdatomic.h>
#include <string.h>

#include "core/util/checked.h"
#include "kernels/cpu/ops.h"
#include "kernels/dtype.h"

/* Present when BLAS is OpenBLAS; weak so another BLAS still links. */
extern void openblas_set_num_threads(int n) __attribute__((weak));

/* String param name (def when absent): *is_b = 1 for b, 0 for a; any other
 * value is refused with set_error. */
static int either(const tsr_plugin_ctx *ctx, const char *name, const char *def, const char *a, const char *b,
                  int *is_b) {
    const tsr_param *p = ctx->host->param(ctx, name);
    const char *v = p && p->type == TSR_PARAM_STRING && p->v.s ? p->v.s : def;
    if (strcmp(v, a) != 0 && strcmp(v, b) != 0) {
        ctx->host->set_error(ctx, "param %s: '%s' is not one of %s, %s", name, v, a, b);
        return TSR_ERR_INVALID;
    }
    *is_b = !strcmp(v, b);
    return TSR_OK;
}

int gemv_engine_init(gemv_engine_cfg *cfg, const tsr_plugin_ctx *ctx) {
    int map;
    if (either(ctx, "weights", "copy", "copy", "map", &map) != TSR_OK) return TSR_ERR_INVALID;
    cfg->copy_weights = !map;
    const tsr_param *p = ctx->host->param(ctx, "isa");
    const char *isa = p && p->type == TSR_PARAM_STRING && p->v.s ? p->v.s : "auto";
    tsr_gemv_isa want;
    if (!strcmp(isa, "auto")) {
        want = tsr_gemv_isa_best();
    } else if (!strcmp(isa, "avx512")) {
        want = TSR_GEMV_ISA_AVX512;
    } else if (!strcmp(isa, "avx2")) {
        want = TSR_GEMV_ISA_AVX2;
    } else if (!strcmp(isa, "portable")) {
        want = TSR_GEMV_ISA_PORTABLE;
    } else {
        ctx->host->set_error(ctx, "param isa: '%s' is not one of auto, avx512, avx2, portable", isa);
        return TSR_ERR_INVALID;
    }
    if (!tsr_gemv_isa_runs(want) || !tsr_gemv_kernel(want)) {
        ctx->host->set_error(ctx, "param isa: this CPU or build cannot run '%s'", isa);
        return TSR_ERR_UNSUPPORTED;
    }
    cfg->kernel = tsr_gemv_kernel(want);
    cfg->i8_kernel = tsr_gemv_i8_kernel(want);
    cfg->q8_0_i16_kernel = tsr_gemv_q8_0_i16_kernel(want);
    cfg->u8_kernel = tsr_gemv_u8_kernel(want);
    cfg->isa = want;
    if (either(ctx, "prefill", "gemm", "gemm", "blas", &cfg->use_blas) != TSR_OK) return TSR_ERR_INVALID;
    p = ctx->host->param(ctx, "glu");
    cfg->glu = p && p->type == TSR_PARAM_BOOL ? p->v.b : 0;
    p = ctx->host->param(ctx, "blas_min_rows");
    cfg->blas_min_rows = p && p->type == TSR_PARAM_INT ? p->v.i : 0;
    p = ctx->host->param(ctx, "blas_min_rows_quant");
    cfg->blas_min_rows_q = p && p->type == TSR_PARAM_INT ? p->v.i : cfg->blas_min_rows;
    p = ctx->host->param(ctx, "blas_tile_rows");
    cfg->tile_rows = p && p->type == TSR_PARAM_INT ? p->v.i : 64;
    if (cfg->blas_min_rows < 0 || cfg->blas_min_rows_q < 0 || cfg->tile_rows < 1 || cfg->tile_rows > 65536) {
        ctx->host->set_error(ctx,
                             "params: blas_min_rows %lld and blas_min_rows_quant %lld must be >= 0, "
                             "blas_tile_rows %lld in 1..65536",
                             (long long)cfg->blas_min_rows, (long long)cfg->blas_min_rows_q,
                             (long long)cfg->tile_rows);
        return TSR_ERR_INVALID;
    }
    if (cfg->use_blas && (cfg->blas_min_rows > 0 || cfg->blas_min_rows_q > 0) && openblas_set_num_threads)
        openblas_set_num_threads(1);
    ctx->host->log(ctx, TSR_LOG_DEBUG, "isa %s, %s from %lld rows", tsr_gemv_isa_name(want), cfg->use_blas ? "blas" : "gemm",
                   (long long)cfg->blas_min_rows);
    return TSR_OK;
}

int gemv_engine_check(const tsr_plugin_ctx *ctx, const tsr_weight *w, uint64_t *row_bytes) {
    const char *name = w->name ? w->name : "(unnamed)";
    if (!tsr_gemv_dtype_supported(w->dtype)) {
        ctx->host->set_error(ctx, "%s: dtype %s is not a weight type", name, tsr_dtype_name(w->dtype));
        return TSR_ERR_UNSUPPORTED;
    }
    if (tsr_weight_scale_of(ctx, w) && w->dtype != TSR_DTYPE_F8_E4M3) { /* the host scales E4M3 only */
        ctx->host->set_error(ctx, "%s: %s weights with scales are not read here", name, tsr_dtype_name(w->dtype));
        return TSR_ERR_UNSUPPORTED;
    }
    uint64_t total;
    if (w->rows <= 0 || w->cols <= 0 || !w->data || tsr_dtype_row_bytes(w->dtype, w->cols, row_bytes) != 0 ||
        tsr_mul_u64(*row_bytes, (uint64_t)w->rows, &total) != 0 || total > w->nbytes) {
        ctx->host->set_error(ctx, "%s: %lld x %lld %s does not fit its %llu bytes", name, (long long)w->rows,
                             (long long)w->cols, tsr_dtype_name(w->dtype), (unsigned long long)w->nbytes);
        return TSR_ERR_INVALID;
    }
    return TSR_OK;
}

int gemv_engine_check_group(const tsr_plugin_ctx *ctx, const tsr_weight *ws, int n, uint64_t *row_bytes,
                            int64_t *rows) {
    if (n < 1) return TSR_ERR_INVALID;
    *rows = 0;
    for (int i = 0; i < n; i++) {
        int rc = gemv_engine_check(ctx, &ws[i], row_bytes);
        if (rc != TSR_OK) return rc;
        if (i > 0 && (ws[i].dtype != ws[0].dtype || ws[i].cols != ws[0].cols)) {
            ctx->host->set_error(ctx, "%s: stacked with %s but of another dtype or width",
                                 ws[i].name ? ws[i].name : "(unnamed)", ws[0].name ? ws[0].name : "(unnamed)");
            return TSR_ERR_INVALID;
        }
        *rows += ws[i].rows;
    }
    return TSR_OK;
}

int gemv_engine_scales(const tsr_plugin_ctx *ctx, const tsr_weight *ws, int n, gemv_matrix *m) {
    int64_t bc = 0; /* the blocks' width where scales change along rows */
    int scaled = 0;
    for (int i = 0; i < n; i++) {
        const tsr_weight_scale *sc = tsr_weight_scale_of(ctx, &ws[i]);
        if (!sc) continue;
        scaled = 1;
        if (sc->block_cols >= m->cols) continue;
        if (bc && sc->block_cols != bc) {
            ctx->host->set_error(ctx, "%s: scales in blocks of %lld columns stacked with blocks of %lld",
                                 ws[i].name ? ws[i].name : "(unnamed)", (long long)sc->block_cols, (long long)bc);
            return TSR_ERR_UNSUPPORTED;
        }
        bc = sc->block_cols;
    }
    if (!scaled) return TSR_OK;
    const int64_t gc = bc ? (m->cols + bc - 1) / bc : 1; /* scales a row */
    float *s = ctx->host->alloc(ctx, (size_t)(m->rows * gc) * sizeof *s, 64);
    if (!s) {
        ctx->host->set_error(ctx, "%s: out of memory for %lld x %lld scales", ws[0].name ? ws[0].name : "(unnamed)",
                             (long long)m->rows, (long long)gc);
        return TSR_ERR_NOMEM;
    }
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const tsr_weight_scale *sc = tsr_weight_scale_of(ctx, &ws[i]);
        const int64_t grid = sc ? (m->cols + sc->block_cols - 1) / sc->block_cols : 1;
        for (int64_t r = 0; r < ws[i].rows; r++)
            for (int64_t b = 0; b < gc; b++) /* block b's first column (b bc) in ws[i]'s grid */
                s[(at + r) * gc + b] = sc ? sc->data[(r / sc->block_rows) * grid + b * bc / sc->block_cols] : 1.0f;
        at += ws[i].rows;
    }
    m->owned = s;
    if (bc) m->cscale = s, m->cscale_cols = bc;
    else m->scale = s;
    return TSR_OK;
}

int gemv_engine_can_give_back(const tsr_host_api *h) {
    return h->version >= 3 && h->struct_size >= offsetof(tsr_host_api, weight_done) + sizeof(void *) &&
           h->weight_done;
}

/* Items are blocks of COPY_BLOCK bytes: copy one, give its pages back. */
#define COPY_BLOCK ((uint64_t)4 << 20)
typedef struct copy_job {
    const tsr_plugin_ctx *ctx;
    const uint8_t *src;
    uint8_t *dst;
    uint64_t n;
    int give_back;
} copy_job;

static void copy_blocks(void *arg, int64_t b0, int64_t b1, int tid) {
    copy_job *j = arg;
    (void)tid;
    for (int64_t b = b0; b < b1; b++) {
        const uint64_t o = (uint64_t)b * COPY_BLOCK, len = j->n - o < COPY_BLOCK ? j->n - o : COPY_BLOCK;
        memcpy(j->dst + o, j->src + o, (size_t)len);
        if (j->give_back) j->ctx->host->weight_done(j->ctx, j->src + o, len);
    }
}

#define ARENA_PAGE ((uint64_t)2 << 20)
#define ARENA_HEAD 64 /* the block's header, then its allocations */

struct gemv_block {
    gemv_block *next;
    uint64_t size, used; /* bytes of the block, header included */
    int live;            /* allocations not yet put back */
};

void *gemv_arena_get(gemv_arena *a, const tsr_plugin_ctx *ctx, uint64_t bytes, gemv_block **block) {
    *block = NULL;
    if (bytes > SIZE_MAX / 2) return NULL;
    const uint64_t need = (bytes + 63) & ~(uint64_t)63;
    gemv_block *b = a->blocks;
    while (b && b->size - b->used < need) b = b->next;
    if (!b) {
        const uint64_t size = (ARENA_HEAD + need + ARENA_PAGE - 1) / ARENA_PAGE * ARENA_PAGE;
        if (!(b = ctx->host->alloc(ctx, (size_t)size, 64))) return NULL;
        *b = (gemv_block){.next = a->blocks, .size = size, .used = ARENA_HEAD};
        a->blocks = b;
    }
    void *p = (uint8_t *)b + b->used;
    b->used += need;
    b->live++;
    *block = b;
    return p;
}

void gemv_arena_put(gemv_arena *a, const tsr_plugin_ctx *ctx, gemv_block *block) {
    if (!block || --block->live > 0) return;
    for (gemv_block **pp = &a->blocks; *pp; pp = &(*pp)->next)
        if (*pp == block) {
            *pp = block->next;
            ctx->host->free(ctx, block);
            return;
        }
}

void gemv_arena_free(gemv_arena *a, const tsr_plugin_ctx *ctx) {
    while (a->blocks) {
        gemv_block *b = a->blocks;
        a->blocks = b->next;
        ctx->host->free(ctx, b);
    }
}

int gemv_engine_weights(const gemv_engine_cfg *cfg, gemv_arena *arena, const tsr_plugin_ctx *ctx,
                        const tsr_weight *ws, int n, int resident, uint64_t row_bytes, const uint8_t **data,
                        gemv_block **block) {
    *data = n == 1 ? ws[0].data : NULL;
    *block = NULL;
    if (!cfg->copy_weights || !resident) return n == 1 ? TSR_OK : TSR_ERR_UNSUPPORTED;
    const char *name = ws[0].name ? ws[0].name : "(unnamed)";
    uint64_t total = 0, part;
    for (int i = 0; i < n; i++)
        if (tsr_mul_u64(row_bytes, (uint64_t)ws[i].rows, &part) || tsr_add_u64(total, part, &total)) {
            total = UINT64_MAX;
            break;
        }
    uint8_t *buf = total <= SIZE_MAX / 2 ? gemv_arena_get(arena, ctx, total, block) : NULL;
    if (!buf) {
        ctx->host->set_error(ctx, "%s%s: out of memory for a %llu-byte copy (param weights: map reads the "
                             "mapping instead)", name, n > 1 ? " and the matrices stacked with it" : "",
                             (unsigned long long)total);
        return TSR_ERR_NOMEM;
    }
    const int give_back = gemv_engine_can_give_back(ctx->host);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t nb = row_bytes * (uint64_t)ws[i].rows;
        copy_job j = {ctx, ws[i].data, buf + off, nb, give_back};
        ctx->host->parallel_for(ctx, (int64_t)((nb + COPY_BLOCK - 1) / COPY_BLOCK), copy_blocks, &j);
        /* the pages that straddle two blocks, now that both are copied */
        if (give_back) ctx->host->weight_done(ctx, ws[i].data, nb);
        off += nb;
    }
    *data = buf;
    return TSR_OK;
}

/* Most gate rows per take of run_glu (a multiple of 8): its scratch holds
 * 2 x this many floats per input row. Each take starts two streams (gate
 * and up rows); 1,024 instead of 256 rows cut a Q8_0 gate/up call of the
 * 0.5B shape from 345 to 314 us on a Xeon VM (fewer stream starts). */
#define GLU_TAKE 1024

/* Most workers whose shares of a decode call's rows are kept (more: take_items). */
#define MAX_SHARES 64

typedef struct run_job {
    const gemv_engine_cfg *cfg;
    const tsr_plugin_ctx *ctx;
    const gemv_matrix *m;
    tsr_gemv_args args;
    volatile int failed;
    atomic_int_fast64_t next; /* the first item (GEMM panel, weight row) not yet taken */
    int64_t group;            /* most items per take */
    int64_t least;            /* fewest items per take (but the last) */
    int64_t align;            /* every take but the last a multiple of this (>= 1) */
    int threads;              /* workers sharing the items */
    float *xs;                /* the GEMM's packed activations (tsr_gemm_pack_x) */
    tsr_gemv_i8_kernel_fn i8; /* int16 or u8 activations: their kernel and arguments (else cfg->kernel, args) */
    tsr_gemv_i8_args i8args;
    int64_t glu;              /* run_glu: the gate rows f (then f up rows); 0: run */
    int shares;               /* decode rows: a share per worker (rows_in_shares); 0: take_items */
    _Atomic uint64_t share[MAX_SHARES]; /* share t's rows not yet taken: [low 32 bits, high 32 bits) */
} run_job;

/* Items [*p0, *p1) for the next take, 0 when none are left. Guided: a
 * take is a share of what is left (1 / (2 x workers)), at most j->group
 * items, at least j->least (or what is left), so that the takes shrink
 * towards the end of the call and the workers finish within about an item
 * of each other. Every take but the last is a multiple of j->align, so
 * that each starts at a multiple of it whatever the timing: the kernels
 * that take four rows at a time (and run_glu's SiLU, eight at a time) then
 * group the same rows in every call, and a row's sum never depends on
 * which worker was faster. */
static int take_items(run_job *j, int64_t items, int64_t *p0, int64_t *p1) {
    int_fast64_t at = atomic_load(&j->next);
    int64_t n;
    do {
        if (at >= items) return 0;
        n = (items - at) / (2 * (int64_t)j->threads);
        n = n < j->least ? j->least : n > j->group ? j->group : n;
        n -= n % j->align;
        if (n < j->align) n = j->align;
        if (n > items - at) n = items - at;
    } while (!atomic_compare_exchange_weak(&j->next, &at, at + n));
    *p0 = at;
    *p1 = at + n;
    return 1;
}

/* Decode rows: one contiguous share per worker (each a multiple of 8 rows
 * but the last), taken front to back, each take half of what is left of it
 * (at least ~64 KiB, j->least rows; at most j->group), so that each worker
 * streams its share as one run in a few kernel calls; a worker done with
 * its own share takes ~64 KiB at a time from the back of the share with the
 * most rows left, so that one slowed by its core's neighbour still does
 * fewer rows instead of making the other wait. Takes
 * start at multiples of 8 (j->align) whatever the timing: the kernels that
 * take four rows at a time (and run_glu's SiLU, eight at a time) group the
 * same rows in every call, and a row's sum never depends on which worker
 * was faster. (Guided takes from one counter, 1 / (2 x workers) of what was
 * left, each worker's takes scattered over the matrix: a pass's GEMVs of
 * the Qwen2.5-0.5B shape in Q8_0 took 551 instead of 493 us a layer on two
 * threads, tools/cpu_lab/seq_lab.c; one-row passes of that shape 18.2 ->
 * 17.8 ms in Q8_0, 29.3 -> 28.6 bf16, 17.8 -> 16.3 int8: BENCHMARKS.md,
 * twenty-second session.) */
static uint64_t share_of(int64_t lo, int64_t hi) { return (uint64_t)lo | (uint64_t)hi << 32; }

static void rows_in_shares(run_job *j, int64_t items) {
    const int64_t least = (int64_t)((65536 + j->m->row_bytes - 1) / j->m->row_bytes);
    j->group = j->glu ? GLU_TAKE : items;
    j->align = 8;
    j->least = least < 1 ? 1 : least > j->group ? j->group : least;
    j->least = (j->least + j->align - 1) / j->align * j->align;
    if (j->least > j->group) j->least = j->group; /* GLU_TAKE is a multiple of 8 */
    atomic_store(&j->next, 0);
    j->shares = 0;
    if (items >= INT32_MAX || j->threads < 1 || j->threads > MAX_SHARES) return; /* take_items instead */
    int64_t per = (items + j->threads - 1) / j->threads;
    per = (per + j->align - 1) / j->align * j->align;
    for (int t = 0; t < j->threads; t++) {
        const int64_t lo = t * per < items ? t * per : items, hi = lo + per < items ? lo + per : items;
        atomic_store(&j->share[t], share_of(lo, hi));
    }
    j->shares = j->threads;
}

/* Items [*p0, *p1) for worker tid's next take (rows_in_shares), 0 when none
 * are left anywhere. */
static int take_share(run_job *j, int tid, int64_t items, int64_t *p0, int64_t *p1) {
    if (!j->shares) return take_items(j, items, p0, p1);
    if (tid >= 0 && tid < j->shares) { /* its own, from the front */
        uint64_t v = atomic_load(&j->share[tid]);
        for (;;) {
            const int64_t lo = (int64_t)(uint32_t)v, hi = (int64_t)(v >> 32);
            if (lo >= hi) break;
            int64_t n = (hi - lo) / 2; /* half of what is left (few kernel calls), at least j->least */
            n = n < j->least ? j->least : n - n % j->align;
            if (n > j->group) n = j->group;
            if (n > hi - lo) n = hi - lo;
            if (atomic_compare_exchange_weak(&j->share[tid], &v, share_of(lo + n, hi))) {
                *p0 = lo, *p1 = lo + n;
                return 1;
            }
        }
    }
    for (;;) { /* another's, from the back of the one with the most left */
        int best = -1;
        int64_t most = 0;
        for (int t = 0; t < j->shares; t++) {
            const uint64_t v = atomic_load(&j->share[t]);
            const int64_t left = (int64_t)(v >> 32) - (int64_t)(uint32_t)v;
            if (left > most) most = left, best = t;
        }
        if (best < 0) return 0;
        uint64_t v = atomic_load(&j->share[best]);
        const int64_t lo = (int64_t)(uint32_t)v, hi = (int64_t)(v >> 32);
        if (lo >= hi) continue;
        /* at most j->least rows (run_glu's scratch holds GLU_TAKE), starting at a multiple of 8 */
        int64_t start = hi - j->least;
        start = start <= lo ? lo : (start + j->align - 1) / j->align * j->align;
        if (atomic_compare_exchange_strong(&j->share[best], &v, share_of(lo, start))) {
            *p0 = start, *p1 = hi;
            return 1;
        }
    }
}

/* Weight rows [a, b) by the job's kernel into y (input row i at y + i * ldy):
 * the weights, their scales and y shifted so that the kernel sees rows
 * [0, b - a). */
static void rows_into(const run_job *j, int64_t a, int64_t b, float *y, int64_t ldy) {
    const uint64_t off = (uint64_t)a * j->m->row_bytes;
    if (j->i8) {
        tsr_gemv_i8_args ia = j->i8args;
        ia.w = (const int8_t *)((const uint8_t *)ia.w + off);
        ia.wscale = ia.wscale ? ia.wscale + a : NULL;
        ia.wsum = ia.wsum ? ia.wsum + a : NULL;
        ia.y = y, ia.ldy = ldy;
        j->i8(&ia, 0, b - a);
    } else {
        tsr_gemv_args ga = j->args;
        ga.w += off;
        ga.scale = ga.scale ? ga.scale + a : NULL;
        ga.cscale = tsr_gemv_cscale_row(&ga, a);
        ga.y = y, ga.ldy = ldy;
        j->cfg->kernel(j->m->dtype, &ga, 0, b - a);
    }
}

/* run_glu: takes of gate rows [a, b); each computes those rows and the up
 * rows [f + a, f + b) into the worker's scratch (one row of 2 x GLU_TAKE
 * floats per input row), then silu(gate) * up into y ([nx, f]). */
static void run_glu_takes(run_job *j, int tid) {
    const int64_t f = j->glu, nx = j->args.nx;
    float *buf = j->ctx->host->alloc(j->ctx, (size_t)(nx * 2 * GLU_TAKE) * sizeof(float), 64);
    if (!buf) {
        j->failed = 1;
        return;
    }
    int64_t a, b;
    while (take_share(j, tid, f, &a, &b)) {
        const int64_t n = b - a;
        rows_into(j, a, b, buf, 2 * n);
        rows_into(j, f + a, f + b, buf + n, 2 * n);
        for (int64_t i = 0; i < nx; i++)
            tsr_silu_mul(j->args.y + i * f + a, buf + i * 2 * n, buf + i * 2 * n + n, n);
    }
    j->ctx->host->free(j->ctx, buf);
}

/* Decode and verification: weight rows taken from the workers' shares (take_share). */
static void run_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    (void)r0, (void)r1;
    run_job *j = arg;
    if (j->glu) {
        run_glu_takes(j, tid);
        return;
    }
    int64_t a, b;
    while (take_share(j, tid, j->m->rows, &a, &b))
        if (j->i8) j->i8(&j->i8args, a, b);
        else j->cfg->kernel(j->m->dtype, &j->args, a, b);
}

/* run_rows over the pool (one call per worker: ranges unused). */
static int run_takes(run_job *j) {
    rows_in_shares(j, j->glu ? j->glu : j->m->rows);
    j->ctx->host->parallel_for(j->ctx, j->m->rows, run_rows, j);
    if (!j->failed) return TSR_OK;
    j->ctx->host->set_error(j->ctx, "out of memory for the gate/up scratch of %d rows", j->args.nx);
    return TSR_ERR_NOMEM;
}

/* Whether decode takes u8 activations (cpu_gemv_int8's x_int8): an int8
 * matrix that kept its rows' sums of codes, a kernel for them, few enough
 * columns for their exact int32 sums. */
static int takes_u8(const gemv_engine_cfg *cfg, const gemv_matrix *m) {
    return m->wsum && m->dtype == TSR_DTYPE_I8 && cfg->u8_kernel && m->cols <= TSR_GEMV_U8_MAX_COLS;
}

/* The kernels with integer activations, each input row quantised to int16
 * or (u8: takes_u8) to u8 with its scale. 1: done (or failed: *rc set); 0:
 * x holds NaN/Inf, take the f32 path. */
static int run_x_int(run_job *rj, int rows, const float *x, float *y, int u8, int *rc) {
    const tsr_plugin_ctx *ctx = rj->ctx;
    const gemv_matrix *m = rj->m;
    const size_t cols = (size_t)m->cols, codes = ((size_t)rows * cols * (u8 ? 1 : 2) + 63) / 64 * 64;
    uint8_t *xq = ctx->host->alloc(ctx, codes + (size_t)rows * sizeof(float), 64);
    if (!xq) {
        ctx->host->set_error(ctx, "out of memory for %d x %lld %s activations", rows, (long long)m->cols,
                             u8 ? "u8" : "int16");
        *rc = TSR_ERR_NOMEM;
        return 1;
    }
    float *xs = (float *)(void *)(xq + codes);
    for (int i = 0; i < rows; i++) {
        const float *xi = x + (size_t)i * cols;
        xs[i] = u8 ? tsr_gemv_quant_x_u8(xi, m->cols, xq + (size_t)i * cols)
                   : tsr_gemv_quant_x_i16(xi, m->cols, (int16_t *)(void *)xq + (size_t)i * cols);
        if (!isfinite(xs[i])) {
            ctx->host->free(ctx, xq);
            return 0;
        }
    }
    rj->i8 = u8 ? rj->cfg->u8_kernel : m->dtype == TSR_DTYPE_Q8_0 ? rj->cfg->q8_0_i16_kernel : rj->cfg->i8_kernel;
    rj->i8args = (tsr_gemv_i8_args){.w = (const int8_t *)m->data, .wscale = m->scale, .cols = m->cols,
                                    .xq = u8 ? NULL : (const int16_t *)(const void *)xq, .xscale = xs, .nx = rows,
                                    .y = y, .ldy = rj->args.ldy, .xu = u8 ? xq : NULL, .wsum = u8 ? m->wsum : NULL};
    *rc = run_takes(rj);
    ctx->host->free(ctx, xq);
    return 1;
}

/* Items are tiles of tile_rows weight rows: widen a tile, one sgemm. */
static void run_blas(void *arg, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    run_job *j = arg;
    const gemv_matrix *m = j->m;
    int64_t tr = j->cfg->tile_rows;
    float *tile = j->ctx->host->alloc(j->ctx, (size_t)(tr * m->cols) * sizeof(float), 64);
    if (!tile) {
        j->failed = 1;
        return;
    }
    for (int64_t t = t0; t < t1; t++) {
        int64_t r0 = t * tr, r1 = r0 + tr < m->rows ? r0 + tr : m->rows;
        tsr_gemv_widen_rows(m->dtype, &j->args, r0, r1, tile);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->args.nx, (int)(r1 - r0), (int)m->cols, 1.0f,
                    j->args.x, (int)m->cols, tile, (int)m->cols, 0.0f, j->args.y + r0, (int)m->rows);
    }
    j->ctx->host->free(j->ctx, tile);
}

/* Items are groups of NR-wide panels of weight rows (gemm_cpu.h). Each
 * worker takes its next panels from a shared counter rather than a fixed
 * share: a worker slowed down (its core shared, a slower memory path) does
 * fewer panels instead of making the other wait at the end of the call. */
static void run_gemm(void *arg, int64_t i0, int64_t i1, int tid) {
    (void)i0, (void)i1, (void)tid;
    run_job *j = arg;
    float *scratch = j->ctx->host->alloc(j->ctx, (size_t)tsr_gemm_scratch_floats(j->args.nx) * sizeof(float), 64);
    if (!scratch) {
        j->failed = 1;
        return;
    }
    int64_t panels = tsr_gemm_panel_count(j->m->rows), p0, p1;
    while (take_items(j, panels, &p0, &p1))
        tsr_gemm_panels(j->cfg->isa, j->m->dtype, &j->args, j->xs, j->m->rows, p0, p1, scratch);
    j->ctx->host->free(j->ctx, scratch);
}

/* Items are the activations' KC-column slices, packed for the GEMM. */
static void pack_slices(void *arg, int64_t s0, int64_t s1, int tid) {
    (void)tid;
    run_job *j = arg;
    tsr_gemm_pack_x(&j->args, s0, s1, j->xs);
}

/* The blocked GEMM: the activations packed (on every worker), then the
 * panels taken in turn. */
static int run_blocked(run_job *j) {
    const tsr_plugin_ctx *ctx = j->ctx;
    j->xs = ctx->host->alloc(ctx, (size_t)tsr_gemm_xpack_floats(j->args.nx, j->args.cols) * sizeof(float), 64);
    if (!j->xs) {
        ctx->host->set_error(ctx, "out of memory for %lld packed activation rows of %lld", (long long)j->args.nx,
                             (long long)j->args.cols);
        return TSR_ERR_NOMEM;
    }
    ctx->host->parallel_for(ctx, tsr_gemm_slice_count(j->args.cols), pack_slices, j);
    j->group = TSR_GEMM_GP; /* takes of up to a block of panels, shrinking at the end; j->threads shapes them */
    ctx->host->parallel_for(ctx, tsr_gemm_panel_count(j->m->rows), run_gemm, j); /* one call per worker */
    ctx->host->free(ctx, j->xs);
    if (j->failed) {
        ctx->host->set_error(ctx, "out of memory for the GEMM's scratch (%lld floats)",
                             (long long)tsr_gemm_scratch_floats(j->args.nx));
        return TSR_ERR_NOMEM;
    }
    return TSR_OK;
}

/* A job over m for rows input rows of x into y ([rows, ldy]). */
static void job_init(run_job *j, const gemv_engine_cfg *cfg, const tsr_plugin_ctx *ctx, const gemv_matrix *m,
                     int rows, const float *x, float *y, int64_t ldy, const tsr_exec *ex) {
    *j = (run_job){.cfg = cfg, .ctx = ctx, .m = m,
                   .args = {.w = m->data, .row_bytes = m->row_bytes, .scale = m->scale, .cols = m->cols,
                            .x = x, .ldx = m->cols, .nx = rows, .y = y, .ldy = ldy, .cscale = m->cscale,
                            .cscale_cols = m->cscale_cols},
                   .group = 1, .least = 1, .align = 1, .threads = ex && ex->n_threads > 0 ? ex->n_threads : 4};
    atomic_init(&j->next, 0);
}

/* Input rows from which the prefill path (GEMM or sgemm) takes over; 0: never. */
static int64_t prefill_rows(const gemv_engine_cfg *cfg, const gemv_matrix *m) {
    return tsr_dtype_block_elems(m->dtype) > 1 ? cfg->blas_min_rows_q : cfg->blas_min_rows;
}

/* The kernels (few input rows) in takes: with int16 activations where the
 * matrix has them and x is finite, else with f32 ones. */
static int run_kernels(run_job *j, int rows, const float *x, float *y) {
    const gemv_engine_cfg *cfg = j->cfg;
    const gemv_matrix *m = j->m;
    int rc;
    const int x_i16 = m->x_i16 && ((m->dtype == TSR_DTYPE_I8 && m->scale && cfg->i8_kernel) ||
                                   (m->dtype == TSR_DTYPE_Q8_0 && cfg->q8_0_i16_kernel));
    if (x_i16 && run_x_int(j, rows, x, y, takes_u8(cfg, m), &rc))
        return rc;
    /* the kernels' permuted activations, made once for all takes (else each take makes its own) */
    const int64_t np = tsr_gemv_permuted_x_floats(cfg->isa, m->dtype, &j->args);
    float *xp = np > 0 ? j->ctx->host->alloc(j->ctx, (size_t)np * sizeof *xp, 64) : NULL;
    if (xp) tsr_gemv_permute_x(cfg->isa, m->dtype, &j->args, xp), j->args.xp = xp;
    rc = run_takes(j);
    j->ctx->host->free(j->ctx, xp);
    return rc;
}

int gemv_engine_run(const gemv_engine_cfg *cfg, const tsr_plugin_ctx *ctx, const gemv_matrix *m,
                    int rows, const float *x, float *y, const tsr_exec *ex) {
    if (rows < 1 || !x || !y) {
        ctx->host->set_error(ctx, "run: %d input rows (need >= 1) or a NULL buffer", rows);
        return TSR_ERR_INVALID;
    }
    run_job j;
    job_init(&j, cfg, ctx, m, rows, x, y, m->rows, ex);
    int64_t min_rows = prefill_rows(cfg, m);
    if (!cfg->use_blas && min_rows > 0 && rows >= min_rows) return run_blocked(&j);
    /* sgemm's int dimensions: fall back to the kernels past them. */
    int blas = cfg->use_blas && min_rows > 0 && rows >= min_rows && m->cols <= INT32_MAX / 2 &&
               m->rows <= INT32_MAX / 2 && m->cols * cfg->tile_rows <= (int64_t)1 << 30;
    if (blas) {
        int64_t tiles = (m->rows + cfg->tile_rows - 1) / cfg->tile_rows;
        ctx->host->parallel_for(ctx, tiles, run_blas, &j);
        if (j.failed) {
            ctx->host->set_error(ctx, "out of memory for a %lld x %lld sgemm tile", (long long)cfg->tile_rows,
                                 (long long)m->cols);
            return TSR_ERR_NOMEM;
        }
        return TSR_OK;
    }
    return run_kernels(&j, rows, x, y);
}

int gemv_engine_run_glu(const gemv_engine_cfg *cfg, const tsr_plugin_ctx *ctx, const gemv_matrix *m,
                        int rows, const float *x, float *y, const tsr_exec *ex) {
    const int64_t min_rows = prefill_rows(cfg, m);
    if (!cfg->glu || !m->glu_rows || rows < 1 || !x || !y || (min_rows > 0 && rows >= min_rows))
        return TSR_ERR_UNSUPPORTED;
    run_job j;
    job_init(&j, cfg, ctx, m, rows, x, y, m->glu_rows, ex);
    j.glu = m->glu_rows;
    return run_kernels(&j, rows, x, y);
}
