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

#define TSR_GEMV_IFACE_VERSION 2

/* A stored weight matrix: a borrowed view that outlives every prepared
 * handle made from it (it points into the model file's mmap). */
typedef struct tsr_weight {
    const char *name;     /* canonical (Hugging Face) tensor name */
    uint32_t dtype;       /* tsr_dtype as stored */
    int64_t rows;         /* output features */
    int64_t cols;         /* input features */
    const void *data;     /* host memory: rows * row_bytes(dtype, cols) bytes */
    uint64_t nbytes;
} tsr_weight;

typedef struct tsr_gemv_i {
    uint32_t struct_size; /* sizeof(tsr_gemv_i) at the plugin's build */
    uint32_t version;     /* TSR_GEMV_IFACE_VERSION */

    /* required: prepare w for run(). *out receives an opaque handle owned by
     * the plugin. TSR_ERR_UNSUPPORTED for a dtype the plugin does not read
     * (the host reports it; it does not fall back). */
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
     * would rather have them alone (the host then prepares them one by one). */
    int (*prepare_group)(void *inst, const tsr_weight *ws, int n, void **out);
} tsr_gemv_i;

#endif /* TSR_GEMV_H */
