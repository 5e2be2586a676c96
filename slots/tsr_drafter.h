/*
 * tsr_drafter.h - the drafter slot: speculative proposals that the runtime
 * verifies in one forward pass of k+1 rows.
 *
 * Greedy requests accept a drafted token iff it equals the target's argmax;
 * sampled requests use rejection sampling against the draft distribution,
 * so what the drafter proposes changes speed, never the output distribution.
 */
#ifndef TSR_DRAFTER_H
#define TSR_DRAFTER_H

#include "tsr_plugin.h"

#define TSR_DRAFTER_IFACE_VERSION 1

typedef struct tsr_draft_req {
    int seq;                 /* the runtime's sequence id */
    const int32_t *tokens;   /* the whole context: prompt and accepted tokens */
    int n_tokens;
    int max_draft;           /* propose at most this many tokens */
} tsr_draft_req;

typedef struct tsr_draft_out {
    int32_t *tokens;         /* [max_draft], filled with n tokens */
    float *probs;            /* [max_draft, vocab] draft distribution of each
                              * proposed token, or NULL when the caller needs none */
    int n;                   /* tokens proposed, 0..max_draft */
    int deterministic;       /* set to 1 if each proposal had probability 1
                              * (probs then left untouched) */
} tsr_draft_out;

typedef struct tsr_drafter_i {
    uint32_t struct_size;
    uint32_t version; /* TSR_DRAFTER_IFACE_VERSION */

    /* required: propose up to r->max_draft tokens that follow r->tokens. */
    int (*propose)(void *inst, const tsr_draft_req *r, tsr_draft_out *out);

    /* optional (default: nothing): n_accepted of the n_proposed tokens of the
     * last proposal for seq were accepted. */
    void (*accept)(void *inst, int seq, int n_proposed, int n_accepted);

    /* optional (default: nothing): seq is finished; drop its state. */
    void (*seq_end)(void *inst, int seq);
} tsr_drafter_i;

#endif /* TSR_DRAFTER_H */
