/*
 * sample_cuda.h - drawing one token from a row of logits on a CUDA device,
 * with the rules of core/runtime/sampling.h (C interface; sample.cu).
 *
 * The caller hands over the parameters as tsr_sampler reads them and the
 * uniform number drawn from the request's random stream on the host; only
 * the chosen id comes back. Device memory throughout (pointers as in
 * cuda_ops.h); stream is a cudaStream_t.
 *
 * What the kernel computes, against sampler.c:
 *   - penalties, temperature, the softmax weights (exp in double, rounded
 *     to float), min-p, the renormalisation and the draw use the same
 *     float and double operations (no contraction into FMA), except that
 *     CUDA's exp and the C library's may differ in the double's last bit,
 *     so a weight may rarely differ by one float ulp;
 *   - the candidate set is found by radix selection over the keys (no
 *     sort): top-k by counts, top-p by mass, ties to the lowest id; with
 *     top-k (or top-p alone), a histogram of coarse buckets below the
 *     maximum first bounds the kept set, and those buckets are compacted
 *     (in id order) into a list that every later step works on instead of
 *     the vocabulary (the passes over the whole vocabulary, penalties and
 *     temperature, the weights and the draw's, run on blocks of 2,048 ids
 *     each; top-k, top-p and min-p in one block of 1024 threads, on the
 *     list where there is one);
 *   - sums run in another order than the CPU's (block reductions and a
 *     scan in id order in double); top-p's cumulative mass is summed in
 *     fixed point (units of 2^-40 of the top weight, deterministic): it
 *     differs from the CPU's double sum by at most vocab * 2^-41.
 * So the same uniform number gives the same token as tsr_sampler except
 * where the draw, a top-p boundary or a min-p threshold lies within that
 * rounding of a cumulative boundary.
 */
#ifndef TSR_KERNELS_CUDA_SAMPLE_H
#define TSR_KERNELS_CUDA_SAMPLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest vocabulary the kernel takes (fixed-point mass sums stay
 * below 2^63). */
#define TSR_CU_SAMPLE_MAX_VOCAB (1 << 23)

typedef struct tsr_cu_sample_args {
    int vocab;                /* 1..TSR_CU_SAMPLE_MAX_VOCAB */
    int greedy;               /* penalties then the argmax; no draw */
    float temperature;        /* > 0 unless greedy */
    int top_k;                /* 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    double u;                 /* the uniform number in [0, 1) */
} tsr_cu_sample_args;

/* Per-token history state [vocab]: bit 0 set once the token is in the
 * history (prompt or generated), bits 1.. count its generated occurrences.
 * Adds ids [n] (device memory): every one marks bit 0, those at index
 * >= gen_from (of this batch) also count as generated. Ids outside
 * [0, vocab) are ignored. state starts zeroed. */
int tsr_cu_sample_history(int32_t *state, const int32_t *ids, int n, int gen_from, int vocab,
                          void *stream);

/* out[0] = the token drawn from logits [vocab] (not modified) under a,
 * with the penalties of state (NULL: none); -1 when no token can be chosen.
 * scratch: device memory of tsr_cu_sample_scratch_bytes(vocab). logits,
 * state, scratch and out must not overlap. Returns 0, or -1 (TSR_ERR_INVALID)
 * when a is out of range or the buffers overlap. */
int tsr_cu_sample(const float *logits, const int32_t *state, const tsr_cu_sample_args *a,
                  void *scratch, int32_t *out, void *stream);
/* 5 * vocab * 4 bytes (keys, weights, and a compacted list: keys, weights,
 * ids) and each wide block's sums and counts (about 16 bytes per 1,000 ids) */
uint64_t tsr_cu_sample_scratch_bytes(int vocab);

#ifdef __cplusplus
}
#endif
#endif /* TSR_KERNELS_CUDA_SAMPLE_H */
