/*
 * model_internal.h - what model.c, forward.c and generate.c share: the
 * loaded model, its prepared weights and the scratch of one forward chunk.
 */
#ifndef TSR_MODEL_INTERNAL_H
#define TSR_MODEL_INTERNAL_H

#include "../../kernels/cpu/ops.h"
#include "../format/model_file.h"
#include "../host/slot_calls.h"
#include "backend.h"
#include "runtime.h"

/* One decoder layer's weights: projections as gemv handles, vectors in f32. */
typedef struct tsr_layer_w {
    float *attn_norm, *ffn_norm;  /* [hidden] */
    float *q_norm, *k_norm;       /* [head_dim] (qwen3) or NULL */
    float *bq, *bk, *bv, *bo;     /* biases or NULL */
    void *wq, *wk, *wv, *wo;
    void *w_gate, *w_up, *w_down; /* dense MLP (NULL in MoE layers) */
    int moe;
    void *w_router;               /* [n_experts, hidden] */
    void *sh_gate, *sh_up, *sh_down; /* qwen2_moe shared expert or NULL */
    void *sh_router;              /* [1, hidden] sigmoid gate of the shared expert */
    void *wqkv;                   /* q, k, v stacked (gemv prepare_group) or NULL: then wq/wk/wv */
    void *w_gu;                   /* gate, up stacked or NULL: then w_gate/w_up */
} tsr_layer_w;

/* A sequence's pipelined greedy decode (pipe.c). */
typedef struct tsr_pipe tsr_pipe;

/* A forward pass captured as a CUDA graph, replayed for later passes of the
 * same sequence with the same rows and outputs (graph.c). */
typedef struct tsr_graph {
    void *exec;                   /* the backend's instantiated graph; NULL: unused */
    int kv_seq, rows, out;        /* out: tsr_fwd_out */
    int pipe;                     /* 0, or 1 + the slot of a pipelined pass (pipe.c) */
    uint64_t last_use;
} tsr_graph;

#define TSR_GRAPH_CACHE 32

/* --profile: time per kind of op, for prefill ([0]) and decode ([1]) passes. */
enum {
    TSR_PROF_EMBED, TSR_PROF_NORM, TSR_PROF_QKV,  TSR_PROF_ROPE,  TSR_PROF_KV,   TSR_PROF_ATTN, TSR_PROF_O,
    TSR_PROF_GATE_UP, TSR_PROF_SILU, TSR_PROF_DOWN, TSR_PROF_ADD, TSR_PROF_HEAD, TSR_PROF_ARGMAX,
    TSR_PROF_KINDS
};
typedef struct tsr_prof {
    double seconds[TSR_PROF_KINDS];
    int64_t calls[TSR_PROF_KINDS];
} tsr_prof;
extern const char *const tsr_prof_names[TSR_PROF_KINDS];

/* What a forward pass hands back. */
typedef enum tsr_fwd_out {
    TSR_FWD_NONE = 0,             /* nothing (prefill chunks before the last) */
    TSR_FWD_LOGITS_LAST = 1,      /* logits of the last row */
    TSR_FWD_LOGITS_ALL = 2,       /* logits of every row */
    TSR_FWD_ARGMAX_LAST = 3,      /* the greedy choice of the last row */
    TSR_FWD_ARGMAX_ALL = 4,       /* the greedy choice of every row */
    TSR_FWD_DEVICE_LAST = 5       /* logits of the last row left in m->logits_dev, nothing comes
                                   * back (device backends: sampled there, dev_sampler.h) */
} tsr_fwd_out;

struct tsr_model {
    int is_view;                  /* a cut of another model: shares all but its scratch */
    char *catalog_dir;            /* as loaded, for models lent to plugins */
    int n_threads;
    tsr_aux_api aux;              /* models lent to this engine's plugins (aux.c) */
    _Atomic uint64_t weight_dones; /* calls of the host's weight_done so far (any thread) */
    tsr_model_file *file;
    tsr_model_config cfg;
    tsr_model_desc desc;
    tsr_engine *engine;
    tsr_tokenizer *tok;
    const tsr_slot_ref *gemv, *attn, *kv, *drafter, *experts;
    tsr_exec ex;
    tsr_rope rope;
    int ctx;
    int chunk;                    /* most rows per forward pass */
    const tsr_tensor *embed;
    void *lm_head;
    float *final_norm;
    tsr_layer_w *layers;
    tsr_expert_source esrc;
    uint64_t weight_bytes_token;
    double load_seconds;
    const tsr_backend *be;        /* where activations live and core kernels run */
    const void *embed_data;       /* the embedding table in the backend's memory */
    uint64_t embed_read;          /* CPU, table given back (tied head copied): the bytes of a row the
                                   * lookup reads from the file; 0: it reads through the mapping */
    uint8_t *embed_rows;          /* embed_read: the chunk's rows, then looked up as ids 0.. (embed_iota) */
    int32_t *embed_iota;
    void *embed_copy;             /* the backend's copy of it (NULL on the CPU: the mmap) */
    float *inv_freq;              /* the backend's copy of rope.inv_freq (NULL on the CPU) */
    /* scratch for one chunk of rows, in the backend's memory */
    float *x, *xn, *q, *k, *v, *att, *o, *g, *u;
    float *qkv, *gu;              /* outputs of stacked q/k/v and gate/up (NULL when unused) */
    void *io;                     /* backend memory: tsr_step, then ids [chunk] */
    void *io_host;                /* its staging copy on the host (pinned on CUDA) */
    int32_t *ids;                 /* = io + sizeof(tsr_step) */
    float *logits_dev;            /* [chunk (CPU: TSR_GRAPH_MAX_ROWS), vocab] in backend memory */
    int32_t *argmax_dev;          /* [chunk] greedy choices in backend memory */
    void *out_host;               /* [TSR_GRAPH_MAX_ROWS, vocab] floats: outputs of replays */
    float *head_out;              /* where the pass in flight writes logits */
    const tsr_exec *cur_ex;       /* the exec of the pass in flight */
    /* the norm weights whose product-ready input the gemv plugin folded
     * into xn (tsr_gemv_fuse.fold_norm, forward.c), or NULL */
    const float *fold;
    int graphs_on;                /* the assembly's runtime.cuda_graphs (off while profiling) */
    int host_sampling;            /* tsr_model_opts.host_sampling */
    int pipeline_on;              /* runtime.pipeline (or tsr_model_opts.force_pipeline) */
    tsr_pipe *pipes;              /* pipes finished sequences gave back, for the next ones */
    tsr_prof *prof;               /* [2] with tsr_model_opts.profile, else NULL */
    int prof_phase;
    tsr_graph graphs[TSR_GRAPH_CACHE];
    uint64_t graph_tick;
    uint64_t graph_captures, graph_replays;
    /* the mixture-of-experts path in backend memory: router logits, the
     * experts' weighted sum, one expert's input rows and intermediates, the
     * shared expert's gate logit; each row's experts and weights [chunk,
     * n_experts_used]; the rows routed to each expert in turn and their
     * weights [chunk * n_experts_used] */
    float *router, *moe_out, *ex_in, *ex_g, *ex_u, *ex_d, *sh_gate_out;
    int32_t *route_idx, *ex_rows;
    float *route_w, *ex_wts;
    /* a prompt's rows of every expert at once, sorted by expert [chunk *
     * n_experts_used rows]: inputs, gate/up outputs, downs; only where the
     * gemv plugin groups them (run_grouped over ex_tables), else NULL */
    float *gx_in, *gx_g, *gx_d;
    int32_t *ex_pos; /* each row's choice's place in that order [chunk * n_experts_used] (with gx_*) */
    /* [n_layers][2]: each MoE layer's experts as tables of the gemv plugin
     * (gate/up pairs, downs; prepare_experts) where the expert cache keeps
     * them all resident and the plugin chooses experts on the device; NULL
     * where the host looks them up (forward.c) */
    void **ex_tables;
    int ex_resident;              /* the expert cache keeps every expert for its life (resident answered) */
    /* host copies of the routing: read to look the experts up, written to
     * say which rows go to which (ex_pos_h: with gx_*, ex_pos's) */
    int32_t *route_idx_h, *ex_rows_h, *ex_pos_h;
    float *route_w_h, *ex_wts_h;
};

struct tsr_seq {
    tsr_model *m;
    int kv_seq;
    int max_tokens;
    int n;            /* tokens in the KV, including those of queued pipelined passes */
    int32_t *tokens;
    tsr_pipe *pipe;   /* pipelined greedy decode (pipe.c), made at its first pass */
};

/* pipe.c: pipelined decode of one sequence (runtime.pipeline). push queues
 * a one-row pass at the sequence's end on token, or (NULL) on the choice of
 * the pass queued before it; at most 2 are queued. Its choice: the argmax
 * (draw NULL), or the draw of draw->dev (a tsr_dev_sampler), which first
 * sends the host's history (draw->history, n_history ids, n_prompt of them
 * the prompt) where token is given. pop waits for the oldest and gives its
 * choice. drop waits for every queued pass and takes their KV back (a
 * generation that ended with passes queued). */
typedef struct tsr_pipe_draw {
    struct tsr_dev_sampler *dev;
    const int32_t *history;
    int n_history, n_prompt;
} tsr_pipe_draw;
int tsr_seq_pipe_push(tsr_seq *s, const int32_t *token, const tsr_pipe_draw *draw, tsr_error *err);
int tsr_seq_pipe_pop(tsr_seq *s, int32_t *choice, tsr_error *err);
int tsr_seq_pipe_drop(tsr_seq *s, tsr_error *err);
int tsr_seq_pipe_queued(const tsr_seq *s);
/* The sequence's pipe back to the model's pool (after its queued passes);
 * tsr_pipes_free frees the pool (the model's end). */
void tsr_seq_pipe_free(tsr_seq *s);
void tsr_pipes_free(tsr_model *m);

/* What an output kind implies: every row or the last, logits or ids, and
 * the bytes of a pass of rows and where they lie in backend memory. */
static inline int tsr_fwd_all_rows(tsr_fwd_out o) { return o == TSR_FWD_LOGITS_ALL || o == TSR_FWD_ARGMAX_ALL; }
static inline int tsr_fwd_logits(tsr_fwd_out o) { return o == TSR_FWD_LOGITS_LAST || o == TSR_FWD_LOGITS_ALL; }
static inline int tsr_fwd_argmax(tsr_fwd_out o) { return o == TSR_FWD_ARGMAX_LAST || o == TSR_FWD_ARGMAX_ALL; }
static inline size_t tsr_fwd_out_bytes(const tsr_model *m, tsr_fwd_out o, int rows) {
    const size_t n = tsr_fwd_all_rows(o) ? (size_t)rows : 1;
    return tsr_fwd_logits(o) ? n * (size_t)m->cfg.vocab * sizeof(float) : tsr_fwd_argmax(o) ? n * sizeof(int32_t) : 0;
}
static inline void *tsr_fwd_out_src(const tsr_model *m, tsr_fwd_out o) {
    return tsr_fwd_logits(o) ? (void *)m->logits_dev : (void *)m->argmax_dev;
}

/* A string naming a failed slot call: "plugin NAME: its message". */
int tsr_model_slot_error(const tsr_model *m, const tsr_slot_ref *s, int rc, tsr_error *err,
                         const char *what);

/* Scratch for one chunk of rows (model.c); freed by tsr_model_free_scratch. */
int tsr_model_alloc_scratch(tsr_model *m, tsr_error *err);
void tsr_model_free_scratch(tsr_model *m);

/* Fill m->aux so the engine's plugins can open models (aux.c). */
void tsr_model_lend_models(tsr_model *m);

/* The forward pass of rows tokens at positions [pos0, pos0 + rows) of kv
 * sequence kv_seq (rows <= m->chunk). out says what comes back into dst:
 * logits [rows or 1, vocab] (float) or greedy choices [rows or 1] (int32).
 * ARGMAX_ALL needs rows <= TSR_GRAPH_MAX_ROWS. Replayed as a CUDA graph
 * where the assembly asks for it and the pass qualifies (graph.c). */
int tsr_forward_chunk(tsr_model *m, int kv_seq, int pos0, const int32_t *tokens, int rows,
                      tsr_fwd_out out, void *dst, tsr_error *err);

/* The pass itself, on inputs already staged in m->io: launches only (no
 * synchronisation, no copies), outputs left in m->logits_dev /
 * m->argmax_dev. ex->step set while capturing (forward.c). */
int tsr_forward_pass(tsr_model *m, const tsr_exec *ex, int kv_seq, int pos0, int rows, tsr_fwd_out out,
                     tsr_error *err);

/* The last row's logits left in m->logits_dev for dev_sampler.h (device
 * backends; TSR_ERR_UNSUPPORTED on the CPU). seq.c */
int tsr_seq_forward_device(tsr_seq *s, const int32_t *tokens, int n, tsr_error *err);

/* graph.c: the pass through a cached CUDA graph when it qualifies;
 * *done = 0 (and nothing run) when it does not. */
int tsr_graph_forward(tsr_model *m, int kv_seq, int pos0, const int32_t *tokens, int rows, tsr_fwd_out out,
                      void *dst, int *done, tsr_error *err);
/* What a captured pass issues (graph.c captures it once per kind): its input
 * copies, the pass (its position read through ex->step), its output copies. */
typedef int (*tsr_graph_body)(tsr_model *m, const tsr_exec *ex, void *ctx, tsr_error *err);
/* Queue the pass of this kind (pipe: tsr_graph.pipe) through its cached
 * graph, body captured first where none is cached; does not wait. *done = 0
 * (and nothing queued) where the pass does not qualify. */
int tsr_graph_queue(tsr_model *m, int kv_seq, int pos0, int rows, tsr_fwd_out out, int pipe, tsr_graph_body body,
                    void *ctx, int *done, tsr_error *err);
/* Drop the graphs of a KV sequence (freed or reallocated), or all. */
void tsr_graphs_forget_seq(tsr_model *m, int kv_seq);
void tsr_graphs_free(tsr_model *m);

#endif /* TSR_MODEL_INTERNAL_H */
