/*
 * tsr_gemv.h - the gemv slot: every projection of the model.
 *
 * The model runtime hands each stored weight matrix to prepare() once at
 * load; the plugin may convert it into its own layout (transpose, quantise,
 * copy to the device) or keep a borrowed pointer into the memory-mapped file.
 * run() then multiplies rows of activations by it: decode is 1 row,
 * verifying k drafts is k+1 rows, prefill is a chunk of rows.
 */
#ifndef TSR_GEMV_H
#define TSR_GEMV_H

#include "tsr_plugin.h"

/* Version 8: tsr_gemv_fuse's fold (the next product's RMSNorm weights
 * applied by the call that adds into the stream, its factor by the next
 * product). Version 7: run_fused (the input's RMSNorm and the residual add done by
 * the product's own launch). Version 6: run_grouped (a mixture of experts' prompt rows, grouped by
 * expert, in one call). Version 5: prepare_experts / run_experts /
 * release_experts (a mixture of experts' projections with the experts
 * chosen on the device). Version 4:
 * run_glu (the gate/up projection and SiLU-and-multiply in one call). Version 3: tsr_weight.scale (the dequantisation scales of FP8
 * checkpoints). A plugin of version >= 3 reads w->scale (through
 * tsr_weight_scale_of) and applies it, or answers TSR_ERR_UNSUPPORTED with a
 * message for a scaled weight it cannot apply; the host never hands a scaled
 * weight to a plugin of version < 3 (it refuses the model, naming the plugin
 * and the tensor). */
#define TSR_GEMV_IFACE_VERSION 8

/* The scales of a weight stored as F8_E4M3 with scale companions (per
 * tensor, per output row, or per block; docs/FORMATS.md has the checkpoint
 * conventions). The value of element (r, c) is
 *     dequant(stored[r, c]) * data[(r / block_rows) * grid_cols + c / block_cols]
 * with grid_cols = ceil(cols / block_cols): one f32 product, rounded once.
 *   per tensor:           block_rows = rows, block_cols = cols   (1 value)
 *   per output row:       block_rows = 1,    block_cols = cols   (rows values)
 *   blocks (DeepSeek-V3): block_rows = block_cols = 128 typically
 *                         ([ceil(rows/128), ceil(cols/128)] values) */
typedef struct tsr_weight_scale {
    const float *data;    /* host f32 [ceil(rows / block_rows), ceil(cols / block_cols)], finite, >= 0 */
    int64_t block_rows;   /* >= 1 */
    int64_t block_cols;   /* >= 1 */
} tsr_weight_scale;

/* What a matrix is to the model, as the host loads it: a plugin may treat
 * them differently (cuda_gemv_fp8 keeps routers unquantised, and runs an
 * expert's one row through the kernel its run_experts uses). */
typedef enum tsr_weight_role {
    TSR_WEIGHT_DENSE = 0,  /* every other projection: attention, a dense or shared expert's MLP, the head */
    TSR_WEIGHT_EXPERT = 1, /* a projection of one expert of a mixture of experts (gate, up or down) */
    TSR_WEIGHT_ROUTER = 2, /* a mixture of experts' router, or its shared expert's gate */
} tsr_weight_role;

/* A stored weight matrix: a borrowed view that outlives every prepared
 * handle made from it (it points into the model file's mmap). */
typedef struct tsr_weight {
    const char *name;     /* canonical (Hugging Face) tensor name, for messages */
    uint32_t dtype;       /* tsr_dtype as stored */
    int64_t rows;         /* output features */
    int64_t cols;         /* input features */
    const void *data;     /* host memory: rows * row_bytes(dtype, cols) bytes */
    uint64_t nbytes;
    /* --- version 3 (hosts of tsr_host_api version >= 4 fill it) --- */
    const tsr_weight_scale *scale; /* NULL: the stored values are the weights */
    /* --- hosts of tsr_host_api version >= 5 fill it --- */
    uint32_t role;                 /* tsr_weight_role; read it through tsr_weight_role_of */
} tsr_weight;

/* w's scales, or NULL when it has none. Read the member only through this:
 * a host older than tsr_host_api version 4 hands a shorter tsr_weight. */
static inline const tsr_weight_scale *tsr_weight_scale_of(const tsr_plugin_ctx *ctx,
                                                          const tsr_weight *w) {
    return ctx && ctx->host && ctx->host->version >= 4 ? w->scale : NULL;
}

/* w's role, or TSR_WEIGHT_DENSE from a host older than tsr_host_api
 * version 5 (whose tsr_weight has no role). */
static inline tsr_weight_role tsr_weight_role_of(const tsr_plugin_ctx *ctx, const tsr_weight *w) {
    return ctx && ctx->host && ctx->host->version >= 5 ? (tsr_weight_role)w->role : TSR_WEIGHT_DENSE;
}

/* row[c] *= the scale of element (r, c) for c < cols: row r of a scaled
 * weight widened to f32, scaled as the formula above says (one product each). */
static inline void tsr_weight_scale_row(const tsr_weight_scale *sc, int64_t r, int64_t cols, float *row) {
    const int64_t grid_cols = (cols + sc->block_cols - 1) / sc->block_cols;
    const float *s = sc->data + (r / sc->block_rows) * grid_cols;
    for (int64_t c = 0; c < cols; c++) row[c] *= s[c / sc->block_cols];
}

/* What run_fused (version 7) does around the product. */
typedef struct tsr_gemv_fuse {
    /* non-NULL: each row of x RMS-normalised first by these weights [cols]
     * (f32, on ex->device): xn[c] = x[c] / sqrt(mean(x^2) + eps) * norm[c] */
    const float *norm;
    float eps;
    int glu;        /* 1: a gate/up pair (prepare_group of two), y = silu(gate) * up as run_glu */
    int accumulate; /* 1: y += the product (y holds the residual stream); 0: y = the product */
    /* --- version 8 (the host sets these for plugins of version >= 8 only) ---
     * The norm before the next product folded into this call and that one,
     * so that no norm runs between them. fold_norm (with accumulate): after
     * the add, also fold_out[c] = y[c] * fold_norm[c] for each row (f32, on
     * ex->device; the stream times the next norm's weights), and keep what
     * the factor 1 / sqrt(mean(y^2) + eps) of those rows needs. folded
     * (with norm, the same weights): x is fold_out of this plugin's latest
     * call with fold_norm, nothing having changed the stream since; the
     * product is then that of x normalised as norm says, the factor taken
     * from what that call kept (within the rounding of the host's rmsnorm
     * followed by run()). Either is TSR_ERR_UNSUPPORTED, nothing done, where
     * the plugin does not fold that call; the host then runs the product
     * without the fold (a declined folded call: its own norm of the stream
     * into x, which fold_out may be). */
    const float *fold_norm;
    float *fold_out;
    int folded;
} tsr_gemv_fuse;

typedef struct tsr_gemv_i {
    uint32_t struct_size; /* sizeof(tsr_gemv_i) at the plugin's build */
    uint32_t version;     /* TSR_GEMV_IFACE_VERSION */

    /* required: prepare w for run(). *out receives an opaque handle owned by
     * the plugin. TSR_ERR_UNSUPPORTED for a dtype the plugin does not read
     * (the host reports it; it does not fall back). Version 3: the same for
     * a scaled weight (w->scale) the plugin cannot apply. */
    int (*prepare)(void *inst, const tsr_weight *w, void **out);

    /* optional (default: nothing): release a prepared handle. */
    void (*release)(void *inst, void *prepared);

    /* required: y[rows, w.rows] = x[rows, w.cols] . W^T, f32 in and out, on
     * ex->device. x and y do not overlap. */
    int (*run)(void *inst, const void *prepared, int rows, const float *x, float *y,
               const tsr_exec *ex);

    /* optional (default: w->nbytes): bytes a prepared handle reads per full
     * pass, for bandwidth accounting. */
    uint64_t (*bytes)(void *inst, const void *prepared);

    /* --- version 2 --- */
    /* optional (default: the host prepares each matrix alone): prepare n
     * matrices of equal cols and dtype as one handle stacked by rows in the
     * given order, so that run() writes y[r] = [W0 x[r], W1 x[r], ...]
     * (sum of ws[i].rows outputs per row) in one pass over the weights. The
     * host stacks q/k/v and gate/up. TSR_ERR_UNSUPPORTED where the plugin
     * would rather have them alone (the host then prepares them one by one).
     * Each ws[i] carries its own scale (version 3); they share one dtype.
     * The host prepares every weight that stays prepared for the model's
     * life here (n = 1 for one alone: the other projections, the output
     * head) and a weight prepared on demand and released again (an expert
     * of an expert cache) through prepare(), so a plugin may treat them
     * differently: cpu_gemv copies the first into memory of 2 MiB pages and
     * reads the second in place. */
    int (*prepare_group)(void *inst, const tsr_weight *ws, int n, void **out);

    /* --- version 4 --- */
    /* optional (default: TSR_ERR_UNSUPPORTED): for a handle that
     * prepare_group made of two matrices of equal rows f, [gate; up],
     *     y[r, i] = silu(g) * u,  g = (W_gate x[r])_i, u = (W_up x[r])_i,
     * silu(g) = g / (1 + e^-g): f outputs per row, bit for bit what run()
     * followed by the host backend's silu_mul_cat on the same device gives,
     * without the [rows, 2f] products in between (on a GPU: one launch
     * less per layer). TSR_ERR_UNSUPPORTED, with nothing done and no error
     * set, for a handle or row count the plugin does not fuse: the host then
     * calls run() and its own SiLU. The host calls it for the stacked
     * gate/up projection of dense layers. */
    int (*run_glu)(void *inst, const void *prepared, int rows, const float *x, float *y,
                   const tsr_exec *ex);

    /* --- version 5 --- */
    /* optional (default: TSR_ERR_UNSUPPORTED): a table over n prepared
     * handles of equal shape (one layer's experts: each a matrix, or each a
     * [gate; up] pair from prepare_group) for run_experts; *out until
     * release_experts. The handles must stay prepared as long. */
    int (*prepare_experts)(void *inst, const void *const *prepared, int n, void **out);
    void (*release_experts)(void *inst, void *table);

    /* optional (default: TSR_ERR_UNSUPPORTED, nothing done): for j < k
     *     y[j] = W_sel[j] . x[j / per_x]    (x rows ldx floats apart)
     * where W_e is the table's handle e and sel [k] lies in ex->device
     * memory, written by work queued before on ex->stream: the experts are
     * chosen where the routing ran, nothing crosses to the host, and the call
     * can be captured in a CUDA graph. y rows hold a handle's outputs (glu:
     * silu(gate) * up, f of them, as run_glu); a negative sel[j] leaves y[j]
     * as it was. Each y[j] bit for bit what run() (run_glu) gives for that one
     * row. TSR_ERR_UNSUPPORTED, with nothing done and no error set, where the
     * plugin does not take the table, k or x (the host then looks the
     * experts up itself). */
    int (*run_experts)(void *inst, const void *table, const int32_t *sel, int k, int per_x, int glu,
                       const float *x, int ldx, float *y, const tsr_exec *ex);

    /* --- version 6 --- */
    /* optional (default: TSR_ERR_UNSUPPORTED, nothing done): the rows of a
     * prompt grouped by expert. x holds them sorted by expert, ldx floats
     * apart, those of the table's handle e at [off[e], off[e + 1]) (off: n +
     * 1 host ints, off[0] = 0, non-decreasing, n the table's handles):
     *     y[r] = W_e . x[r]      for r < off[n]   (y rows as run_experts')
     * (glu: silu(gate) * up, f outputs, as run_glu). Each row within the
     * rounding of the plugin's prompt arithmetic (not bit for bit what run()
     * gives). One call for every expert of a layer, where the host would
     * otherwise run each expert's rows through run() in turn.
     * TSR_ERR_UNSUPPORTED, nothing done and no error set, where the plugin
     * does not take the table, the rows or x. */
    int (*run_grouped)(void *inst, const void *table, const int32_t *off, int n, int glu, const float *x,
                       int ldx, float *y, const tsr_exec *ex);

    /* --- version 7 --- */
    /* optional (default: TSR_ERR_UNSUPPORTED, nothing done): the product
     * run() (fu->glu: run_glu) gives, with the host's ops around it done in
     * the same call:
     *     y  = P(xn)        or, with fu->accumulate,   y += P(xn)
     * xn = x normalised as fu->norm says (x itself without it). The
     * accumulation alone is bit for bit y + run()'s result added as the
     * host backend's add does (one f32 sum an element); with a norm, y is
     * within the rounding of f32 arithmetic of the host's rmsnorm followed
     * by run() (the norm's factor may multiply each sum instead of each
     * activation). x and y do not overlap. TSR_ERR_UNSUPPORTED, with nothing
     * done and no error set, where the plugin does not fuse that
     * combination for the handle and row count: the host then runs its own
     * norm, run() and add. On a GPU each fused op is a launch less, and the
     * product no longer waits for a one-block norm kernel (the host fuses
     * dense layers' input norms into q/k/v and gate/up and their residual
     * adds into o and down). */
    int (*run_fused)(void *inst, const void *prepared, int rows, const float *x, float *y,
                     const tsr_gemv_fuse *fu, const tsr_exec *ex);
} tsr_gemv_i;

#endif /* TSR_GEMV_H */
