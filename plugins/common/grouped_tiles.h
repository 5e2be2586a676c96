// grouped_tiles.h - what the CUDA gemv plugins' run_grouped share (cuda_gemv,
// cuda_gemv_fp8; the kernel is kernels/cuda/grouped.cuh): the check of the
// host's row offsets and the tile list, built on the host and copied to the
// device in stream order, grown to the longest list seen. Header-only; it
// calls the host only through ctx->host.
#ifndef TSR_PLUGINS_GROUPED_TILES_H
#define TSR_PLUGINS_GROUPED_TILES_H

#include <stdlib.h>

#include "kernels/cuda/grouped.cuh"
#include "slots/tsr_plugin.h"

struct GroupedTiles {
    tsr_grouped::Tile *h, *d; // host list, device copy
    int64_t cap;              // tiles each holds
};

// Whether off[0..n] is what run_grouped takes: n >= 1, off[0] = 0, non-decreasing.
inline bool grouped_offsets_ok(const int32_t *off, int n) {
    if (n < 1 || !off || off[0] != 0) return false;
    for (int e = 0; e < n; e++)
        if (off[e + 1] < off[e]) return false;
    return true;
}

// The tiles of rows off[0..n] over n_out weight rows (glu: a [gate; up]
// pair) into t->d, queued on st; *k their count. TSR_OK;
// TSR_ERR_UNSUPPORTED (nothing done) past a grid's blocks; else an error,
// set on ctx. From pageable memory: staged before the call returns, so the
// host list may be rewritten by the next call.
inline int grouped_tiles_upload(const tsr_plugin_ctx *ctx, GroupedTiles *t, const int32_t *off, int n, int n_out,
                                bool glu, cudaStream_t st, int64_t *k) {
    *k = tsr_grouped::tile_count(off, n, n_out, glu);
    if (*k > 0x7fffffff) return TSR_ERR_UNSUPPORTED;
    if (*k > t->cap) {
        const tsr_host_api *h = ctx->host;
        tsr_grouped::Tile *hn = static_cast<tsr_grouped::Tile *>(malloc((size_t)*k * sizeof *hn));
        void *dn = nullptr;
        const int rc = hn ? h->dev_alloc(ctx, (size_t)*k * sizeof *hn, &dn) : TSR_ERR_NOMEM;
        if (rc != TSR_OK) {
            free(hn);
            if (rc == TSR_ERR_NOMEM) h->set_error(ctx, "out of memory for %lld expert tiles", (long long)*k);
            return rc;
        }
        free(t->h);
        if (t->d) {
            cudaStreamSynchronize(st); // the last list may still be read
            h->dev_free(ctx, t->d);
        }
        t->h = hn, t->d = static_cast<tsr_grouped::Tile *>(dn), t->cap = *k;
    }
    tsr_grouped::make_tiles(off, n, n_out, glu, t->h);
    const cudaError_t e = cudaMemcpyAsync(t->d, t->h, (size_t)*k * sizeof *t->h, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) return TSR_OK;
    ctx->host->set_error(ctx, "expert tiles: CUDA error %d (%s)", (int)e, cudaGetErrorString(e));
    return TSR_ERR_DEVICE;
}

inline void grouped_tiles_free(const tsr_plugin_ctx *ctx, GroupedTiles *t) {
    if (t->d) ctx->host->dev_free(ctx, t->d);
    free(t->h);
    *t = GroupedTiles{};
}

#endif // TSR_PLUGINS_GROUPED_TILES_H
