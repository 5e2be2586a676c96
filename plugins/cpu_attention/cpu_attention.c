/*
 * cpu_attention - fused, threaded attention with an online softmax over the
 * KV, for f32, f16 and int8 (per-token, per-head scales) contiguous KV.
 *
 * Work is cut into tiles of up to 8 queries that read the same KV head (the
 * query heads of one GQA group, of one or more rows), so each KV head's keys
 * and values stream from memory once per tile, never copied or widened (see
 * kernels/cpu/attn_kernels.h). A tile of several rows runs the token range
 * every row sees in one pass and each row's own head and tail apart. Tiles
 * are spread over the host's thread pool; a single decode row whose tiles do
 * not divide evenly among the threads is also split along the KV (partial
 * softmax states merged afterwards).
 */
#include <math.h>
#include <string.h>

#include "core/util/checked.h"
#include "kernels/cpu/attn_kernels.h"
#include "slots/tsr_attention.h"

/* Below this many multiply-adds (~5 us on one core) a call is not worth the
 * thread pool. Since its workers spin for 50 us before sleeping
 * (threadpool.c), a call between two GEMVs finds them awake: a Qwen2.5-0.5B
 * decode row at 160 keys (287K multiply-adds, below the former 524K) took
 * 15 instead of 23 us a layer on two threads of a Xeon VM, the pass 2.7%
 * less (BENCHMARKS.md, fourteenth session). */
#define INLINE_MADDS 131072.0

typedef struct cpu_attn {
    const tsr_plugin_ctx *ctx;
    int isa; /* param isa: TSR_ATTN_ISA_* cap for every tile */
} cpu_attn;

static int attn_init(void *inst, const tsr_plugin_ctx *ctx) {
    cpu_attn *c = inst;
    c->ctx = ctx;
    const tsr_param *isa = ctx->host->param(ctx, "isa");
    const char *s = isa && isa->type == TSR_PARAM_STRING && isa->v.s ? isa->v.s : "auto";
    if (!strcmp(s, "portable")) {
        c->isa = TSR_ATTN_ISA_PORTABLE;
    } else if (!strcmp(s, "avx2") || !strcmp(s, "avx512")) {
        c->isa = !strcmp(s, "avx2") ? TSR_ATTN_ISA_AVX2 : TSR_ATTN_ISA_AVX512;
        if (tsr_attn_isa_level() < c->isa) {
            ctx->host->set_error(ctx, "param isa = %s, but this CPU lacks %s", s,
                                 c->isa == TSR_ATTN_ISA_AVX2 ? "AVX2, FMA or F16C" : "AVX-512F");
            return TSR_ERR_UNSUPPORTED;
        }
    } else if (strcmp(s, "auto")) {
        ctx->host->set_error(ctx, "param isa = '%s': expected auto, avx512, avx2 or portable", s);
        return TSR_ERR_INVALID;
    }
    return TSR_OK;
}

/* The plan of one call: which queries each work item holds. */
typedef struct attn_plan {
    const tsr_attn_args *a;
    int group;            /* query heads per KV head */
    int rows_per_tile;    /* rows in a tile (group < 8), else 1 */
    int heads_per_tile;   /* query heads of one row in a tile */
    int head_chunks;      /* tiles across one row's group */
    int row_tiles;        /* tiles down the rows */
    int tiles;            /* per KV head */
    int splits;           /* parts of the KV range (decode only) */
    int64_t items;
    int isa;              /* TSR_ATTN_ISA_* cap of the kernels' paths */
    float *part;          /* splits > 1: [items][8][head_dim] */
    float *part_ml;       /* splits > 1: [items][2][8] */
} attn_plan;

static int first_visible(const tsr_attn_args *a, int row) {
    int last = a->pos0 + row;
    return a->window > 0 && last - a->window + 1 > 0 ? last - a->window + 1 : 0;
}

static void kv_for_head(const tsr_kv_view *v, int kvh, tsr_attn_kv *out) {
    size_t esz = v->dtype == TSR_DTYPE_F32 ? 4 : v->dtype == TSR_DTYPE_F16 ? 2 : 1;
    out->dtype = v->dtype;
    out->k = (const char *)v->k + esz * (size_t)(kvh * v->head_stride);
    out->v = (const char *)v->v + esz * (size_t)(kvh * v->head_stride);
    out->token_stride = v->token_stride;
    out->k_scale = v->k_scale ? v->k_scale + kvh : NULL;
    out->v_scale = v->v_scale ? v->v_scale + kvh : NULL;
    out->scale_stride = v->n_kv_heads;
}

/* Run tokens [t0, t1) for the queries [i0, i1) of tile t (sharing state). */
static void run_subset(tsr_attn_tile *t, int i0, int i1, const tsr_attn_kv *kv, int hd, float scale,
                       int t0, int t1) {
    if (t1 <= t0) return;
    if (i0 == 0 && i1 == t->nq) {
        tsr_attn_tile_run(t, kv, hd, scale, t0, t1);
        return;
    }
    tsr_attn_tile sub;
    sub.nq = i1 - i0;
    sub.isa = t->isa;
    for (int i = 0; i < sub.nq; i++) {
        sub.q[i] = t->q[i0 + i];
        sub.acc[i] = t->acc[i0 + i];
        sub.m[i] = t->m[i0 + i];
        sub.l[i] = t->l[i0 + i];
    }
    tsr_attn_tile_run(&sub, kv, hd, scale, t0, t1);
    for (int i = 0; i < sub.nq; i++) {
        t->m[i0 + i] = sub.m[i];
        t->l[i0 + i] = sub.l[i];
    }
}

/* Item -> (kv head, tile, split). Tiles are taken in zig-zag order of rows
 * so each thread's contiguous share mixes short and long causal ranges. */
static void item_decode(const attn_plan *p, int64_t item, int *kvh, int *tile, int *split) {
    *split = (int)(item % p->splits);
    int64_t rest = item / p->splits;
    int z = (int)(rest % p->tiles);
    *kvh = (int)(rest / p->tiles);
    *tile = z % 2 == 0 ? z / 2 : p->tiles - 1 - z / 2;
}

static void attn_items(void *arg, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const attn_plan *p = arg;
    const int isa = p->isa;
    const tsr_attn_args *a = p->a;
    const int hd = a->head_dim;
    for (int64_t item = i0; item < i1; item++) {
        int kvh, tile, split;
        item_decode(p, item, &kvh, &tile, &split);
        int rt = tile / p->head_chunks, hc = tile % p->head_chunks;
        int r0 = rt * p->rows_per_tile;
        int r1 = r0 + p->rows_per_tile < a->rows ? r0 + p->rows_per_tile : a->rows;
        int gh0 = hc * p->heads_per_tile;
        int gh1 = gh0 + p->heads_per_tile < p->group ? gh0 + p->heads_per_tile : p->group;
        int per_row = gh1 - gh0;

        tsr_attn_tile t;
        t.nq = (r1 - r0) * per_row;
        t.isa = isa;
        for (int r = r0; r < r1; r++)
            for (int g = gh0; g < gh1; g++) {
                int i = (r - r0) * per_row + (g - gh0), h = kvh * p->group + g;
                int64_t off = ((int64_t)r * a->n_heads + h) * hd;
                t.q[i] = a->q + off;
                t.acc[i] = p->splits > 1 ? p->part + ((size_t)item * TSR_ATTN_TILE + i) * hd
                                         : a->out + off;
            }
        tsr_attn_tile_reset(&t, hd);
        tsr_attn_kv kv;
        kv_for_head(a->kv, kvh, &kv);

        if (p->splits > 1) { /* one row: its visible range, cut in splits parts */
            int f = first_visible(a, r0), e = a->pos0 + r0 + 1;
            int64_t len = e - f;
            int s0 = f + (int)(len * split / p->splits), s1 = f + (int)(len * (split + 1) / p->splits);
            tsr_attn_tile_run(&t, &kv, hd, a->scale, s0, s1);
            float *ml = p->part_ml + (size_t)item * 2 * TSR_ATTN_TILE;
            memcpy(ml, t.m, sizeof t.m);
            memcpy(ml + TSR_ATTN_TILE, t.l, sizeof t.l);
            continue;
        }
        /* tokens every row of the tile sees, then each row's own remainder */
        int c0 = first_visible(a, r1 - 1), c1 = a->pos0 + r0 + 1;
        if (c0 < c1) {
            tsr_attn_tile_run(&t, &kv, hd, a->scale, c0, c1);
            for (int r = r0; r < r1; r++) {
                int i = (r - r0) * per_row;
                run_subset(&t, i, i + per_row, &kv, hd, a->scale, first_visible(a, r), c0);
                run_subset(&t, i, i + per_row, &kv, hd, a->scale, c1, a->pos0 + r + 1);
            }
        } else {
            for (int r = r0; r < r1; r++) {
                int i = (r - r0) * per_row;
                run_subset(&t, i, i + per_row, &kv, hd, a->scale, first_visible(a, r), a->pos0 + r + 1);
            }
        }
        tsr_attn_tile_finish(&t, t.acc, hd);
    }
}

/* splits > 1: fold each query's partial states into split 0's and finish. */
static void merge_splits(const attn_plan *p) {
    const tsr_attn_args *a = p->a;
    const int hd = a->head_dim;
    for (int64_t base = 0; base < p->items; base += p->splits) {
        int kvh, tile, split;
        item_decode(p, base, &kvh, &tile, &split);
        int gh0 = (tile % p->head_chunks) * p->heads_per_tile;
        int gh1 = gh0 + p->heads_per_tile < p->group ? gh0 + p->heads_per_tile : p->group;
        for (int i = 0; i < gh1 - gh0; i++) {
            float *ml0 = p->part_ml + (size_t)base * 2 * TSR_ATTN_TILE;
            float m = ml0[i], l = ml0[TSR_ATTN_TILE + i];
            float *acc = p->part + ((size_t)base * TSR_ATTN_TILE + i) * hd;
            for (int s = 1; s < p->splits; s++) {
                const float *ml = p->part_ml + (size_t)(base + s) * 2 * TSR_ATTN_TILE;
                tsr_attn_state_merge(&m, &l, acc, ml[i], ml[TSR_ATTN_TILE + i],
                                     p->part + ((size_t)(base + s) * TSR_ATTN_TILE + i) * hd, hd);
            }
            tsr_attn_tile one = {.nq = 1};
            one.acc[0] = acc;
            one.m[0] = m;
            one.l[0] = l;
            float *out = a->out + (int64_t)(kvh * p->group + gh0 + i) * hd; /* one row */
            tsr_attn_tile_finish(&one, &out, hd);
        }
    }
}

static int attn_run(void *inst, const tsr_attn_args *a, const tsr_exec *ex) {
    cpu_attn *c = inst;
    const tsr_host_api *h = c->ctx->host;
    const tsr_kv_view *kv = a ? a->kv : NULL;
    if (!a || !kv || !a->q || !a->out) {
        h->set_error(c->ctx, "attention args, q, out and kv must be set");
        return TSR_ERR_INVALID;
    }
    if (kv->layout != TSR_KV_CONTIGUOUS ||
        (kv->dtype != TSR_DTYPE_F32 && kv->dtype != TSR_DTYPE_F16 && kv->dtype != TSR_DTYPE_I8)) {
        h->set_error(c->ctx, "reads f32, f16 and i8 contiguous KV only (got dtype %u layout %u)",
                     kv->dtype, kv->layout);
        return TSR_ERR_UNSUPPORTED;
    }
    if (a->rows < 0 || a->pos0 < 0 || a->window < 0 || a->head_dim <= 0 || a->n_kv_heads <= 0 ||
        a->n_heads <= 0 || a->n_heads % a->n_kv_heads != 0 ||
        (int64_t)kv->n_tokens < (int64_t)a->pos0 + a->rows || kv->head_dim != a->head_dim ||
        kv->n_kv_heads != a->n_kv_heads || kv->token_stride < 0 || kv->head_stride < 0 || !kv->k ||
        !kv->v) {
        h->set_error(c->ctx,
                     "inconsistent shapes: %d heads, %d kv heads (view %d), head_dim %d (view %d), "
                     "%d KV tokens for rows %d..%d, window %d",
                     a->n_heads, a->n_kv_heads, kv->n_kv_heads, a->head_dim, kv->head_dim,
                     kv->n_tokens, a->pos0, a->pos0 + a->rows - 1, a->window);
        return TSR_ERR_INVALID;
    }
    if (kv->dtype == TSR_DTYPE_I8 && (!kv->k_scale || !kv->v_scale)) {
        h->set_error(c->ctx, "i8 KV view without k_scale/v_scale");
        return TSR_ERR_INVALID;
    }
    if (a->rows == 0) return TSR_OK;

    attn_plan p = {.a = a, .group = a->n_heads / a->n_kv_heads, .splits = 1, .isa = c->isa};
    if (p.group >= TSR_ATTN_TILE) {
        p.rows_per_tile = 1;
        p.heads_per_tile = TSR_ATTN_TILE;
    } else {
        p.rows_per_tile = TSR_ATTN_TILE / p.group;
        p.heads_per_tile = p.group;
    }
    p.head_chunks = (p.group + p.heads_per_tile - 1) / p.heads_per_tile;
    p.row_tiles = (a->rows + p.rows_per_tile - 1) / p.rows_per_tile;
    p.tiles = p.row_tiles * p.head_chunks;
    int64_t base_items = (int64_t)a->n_kv_heads * p.tiles;
    int nt = ex && ex->n_threads > 1 ? ex->n_threads : 1;
    int len = a->pos0 + 1 - first_visible(a, 0);
    if (a->rows == 1 && nt > 1 && base_items % nt != 0 && len >= 256) {
        p.splits = len / 128 < nt ? len / 128 : nt;
        if (p.splits < 1) p.splits = 1;
    }
    p.items = base_items * p.splits;
    if (p.splits > 1) {
        uint64_t nbytes, mlbytes;
        if (tsr_mul_u64((uint64_t)p.items * TSR_ATTN_TILE, (uint64_t)a->head_dim * sizeof(float), &nbytes) ||
            tsr_mul_u64((uint64_t)p.items, 2 * TSR_ATTN_TILE * sizeof(float), &mlbytes)) {
            h->set_error(c->ctx, "partial state size overflows");
            return TSR_ERR_INVALID;
        }
        p.part = h->alloc(c->ctx, (size_t)nbytes, 64);
        p.part_ml = h->alloc(c->ctx, (size_t)mlbytes, 64);
        if (!p.part || !p.part_ml) {
            h->free(c->ctx, p.part);
            h->free(c->ctx, p.part_ml);
            h->set_error(c->ctx, "out of memory for %lld partial attention states", (long long)p.items);
            return TSR_ERR_NOMEM;
        }
    }
    /* Small calls (tiny models, short contexts) run on the calling thread:
     * waking the pool costs more than the work. */
    int64_t span = a->window > 0 && a->window < a->pos0 + a->rows ? a->window : a->pos0 + a->rows;
    double madds = 2.0 * a->rows * a->n_heads * (double)span * a->head_dim;
    if (nt == 1 || madds < INLINE_MADDS) attn_items(&p, 0, p.items, 0);
    else h->parallel_for(c->ctx, p.items, attn_items, &p);
    if (p.splits > 1) {
        merge_splits(&p);
        h->free(c->ctx, p.part);
        h->free(c->ctx, p.part_ml);
    }
    return TSR_OK;
}

static const tsr_attention_i cpu_attn_iface = {
    .struct_size = sizeof(tsr_attention_i),
    .version = TSR_ATTENTION_IFACE_VERSION,
    .run = attn_run,
};

static const tsr_plugin_desc cpu_attn_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "cpu_attention",
    .slot = TSR_SLOT_ATTENTION,
    .version = "1.0.0",
    .instance_size = sizeof(cpu_attn),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = attn_init,
    .fini = NULL,
    .iface = &cpu_attn_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &cpu_attn_desc; }
