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
} tsr_layer_w;

struct tsr_model {
    int is_view;                  /* a cut of another model: shares all but its scratch */
    char *catalog_dir;            /* as loaded, for models lent to plugins */
    int n_threads;
    tsr_aux_api aux;              /* models lent to this engine's plugins (aux.c) */
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
    void *embed_copy;             /* the backend's copy of it (NULL on the CPU: the mmap) */
    float *inv_freq;              /* the backend's copy of rope.inv_freq (NULL on the CPU) */
    /* scratch for one chunk of rows, in the backend's memory */
    float *x, *xn, *q, *k, *v, *att, *o, *g, *u;
    int32_t *ids;                 /* [chunk] token ids */
    float *logits_dev;            /* [chunk, vocab] (NULL on the CPU) */
    /* host scratch of the mixture-of-experts path (CPU only) */
    float *router, *moe_out, *ex_in, *ex_g, *ex_u, *ex_d, *sh_gate_out;
    int32_t *topk_idx;            /* [chunk, n_experts_used] */
    float *topk_w;
    int32_t *ex_rows;             /* rows routed to one expert */
    float *ex_wts;
};

struct tsr_seq {
    tsr_model *m;
    int kv_seq;
    int max_tokens;
    int n;
    int32_t *tokens;
};

/* A string naming a failed slot call: "plugin NAME: its message". */
int tsr_model_slot_error(const tsr_model *m, const tsr_slot_ref *s, int rc, tsr_error *err,
                         const char *what);

/* Scratch for one chunk of rows (model.c); freed by tsr_model_free_scratch. */
int tsr_model_alloc_scratch(tsr_model *m, tsr_error *err);
void tsr_model_free_scratch(tsr_model *m);

/* Fill m->aux so the engine's plugins can open models (aux.c). */
void tsr_model_lend_models(tsr_model *m);

/* The forward pass of rows tokens at positions [pos0, pos0 + rows) of kv
 * sequence kv_seq (rows <= m->chunk). logits: [rows, vocab] if all_rows,
 * [1, vocab] (last row) otherwise, or NULL. */
int tsr_forward_chunk(tsr_model *m, int kv_seq, int pos0, const int32_t *tokens, int rows,
                      float *logits, int all_rows, tsr_error *err);

#endif /* TSR_MODEL_INTERNAL_H */
