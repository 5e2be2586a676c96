/*
 * runtime.h - the model runtime: a checkpoint run through an assembled
 * engine, sequences, and step-wise generation shared by the CLI and the
 * server.
 */
#ifndef TSR_RUNTIME_H
#define TSR_RUNTIME_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "../format/model_config.h"
#include "../host/engine.h"
#include "../tokenizer/tokenizer.h"
#include "../util/error.h"
#include "sampling.h"

typedef struct tsr_model tsr_model;

typedef struct tsr_model_opts {
    const char *model_path;     /* NULL: the embedded default model */
    const char *assembly_path;  /* NULL: the default CPU assembly */
    const char *tokenizer_path; /* NULL: found from the model */
    const char *catalog_dir;    /* NULL: the default catalog */
    int n_threads;              /* 0: every core */
    int max_ctx;                /* 0: the model's context length */
    int progress;               /* print loading progress to stderr */
    int no_tokenizer;           /* ids only (score): load no tokenizer; generation then
                                 * reports tokens without text */
    int profile;                /* time every op (synchronising after each, no CUDA
                                 * graphs): see tsr_model_profile_print */
    int host_sampling;          /* bring sampled rows to the host even where the backend
                                 * samples on its device (what that is worth; tests) */
    int force_pipeline;         /* decode greedy requests through the pipelined path
                                 * (runtime.pipeline) whatever the assembly says, also on
                                 * the CPU, whose passes end before the call returns (tests
                                 * of its bookkeeping) */
} tsr_model_opts;

int tsr_model_load(const tsr_model_opts *o, tsr_model **out, tsr_error *err);
void tsr_model_free(tsr_model *m);

const tsr_model_config *tsr_model_get_config(const tsr_model *m);
const tsr_tokenizer *tsr_model_get_tokenizer(const tsr_model *m); /* NULL with no_tokenizer */
tsr_engine *tsr_model_get_engine(const tsr_model *m);
int tsr_model_ctx(const tsr_model *m);              /* context length in tokens */
double tsr_model_load_seconds(const tsr_model *m);
/* KV bytes in use and reserved (the kv_cache plugin's usage). */
void tsr_model_kv_usage(const tsr_model *m, uint64_t *used, uint64_t *capacity);
/* Bytes of weights read for one decode token (prepared sizes). */
uint64_t tsr_model_weight_bytes_per_token(const tsr_model *m);

/* One sequence: its KV and its tokens. */
typedef struct tsr_seq tsr_seq;

int tsr_seq_new(tsr_model *m, int max_tokens, tsr_seq **out, tsr_error *err);
void tsr_seq_free(tsr_seq *s);
int tsr_seq_len(const tsr_seq *s);
const int32_t *tsr_seq_tokens(const tsr_seq *s);

/* Run n tokens after those already in the sequence (prefill in chunks,
 * decode, or verification rows). logits receives [n, vocab] when all_rows,
 * else [1, vocab] for the last token; NULL for none. */
int tsr_seq_forward(tsr_seq *s, const int32_t *tokens, int n, float *logits, int all_rows,
                    tsr_error *err);
/* The same, handing back only the greedy choice (highest logit, ties to
 * the lowest id, -1 where every logit is NaN or -inf) of each row (at most
 * TSR_GRAPH_MAX_ROWS rows) or of the last: on a GPU the logits stay there. */
int tsr_seq_forward_greedy(tsr_seq *s, const int32_t *tokens, int n, int32_t *choices, int all_rows,
                           tsr_error *err);
/* With tsr_model_opts.profile: a table of time per kind of op, prefill
 * and decode passes apart. */
void tsr_model_profile_print(const tsr_model *m, FILE *f);
/* Forget the times gathered so far (profile mode; nothing otherwise). */
void tsr_model_profile_reset(tsr_model *m);
/* Passes captured as CUDA graphs and replays of them so far (both 0 unless
 * the assembly sets runtime.cuda_graphs). */
void tsr_model_graph_stats(const tsr_model *m, uint64_t *captures, uint64_t *replays);
/* Drop tokens after the first n (KV rollback). Pipelined passes still
 * queued (runtime.pipeline) are waited for and dropped first, so n counts
 * against the tokens before them. */
int tsr_seq_truncate(tsr_seq *s, int n, tsr_error *err);

/* Generation. */
typedef enum tsr_finish {
    TSR_FINISH_NONE = 0,      /* still running */
    TSR_FINISH_STOP = 1,      /* EOS token or a stop string */
    TSR_FINISH_LENGTH = 2,    /* max_tokens or the context is full */
    TSR_FINISH_CANCELLED = 3
} tsr_finish;

#define TSR_MAX_STOP 8

typedef struct tsr_gen_params {
    tsr_sampling sampling;
    int max_tokens;             /* >= 1 */
    const char *stop[TSR_MAX_STOP]; /* stop strings (borrowed for the generation's life) */
    int n_stop;
    int logprobs;               /* report each token's log-probability */
    int top_logprobs;           /* 0..TSR_MAX_TOP_LOGPROBS alternatives */
    int ignore_eos;
} tsr_gen_params;

/* What one step produced. text is what may be shown now: complete UTF-8,
 * with anything that could still become a stop string held back, and cut
 * before a stop string that matched. */
typedef struct tsr_gen_event {
    const tsr_token_info *tokens; /* tokens accepted in this step */
    int n_tokens;
    const char *text;
    size_t text_len;
    tsr_finish finish;            /* set on the last event */
} tsr_gen_event;

typedef struct tsr_gen tsr_gen;

/* Start generating after prompt (n_prompt >= 1). Fails with TSR_ERR_RANGE
 * when prompt + max_tokens exceeds the context. */
int tsr_gen_start(tsr_model *m, const int32_t *prompt, int n_prompt, const tsr_gen_params *p,
                  tsr_gen **out, tsr_error *err);
/* Advance one step (the first step runs the prefill). ev is valid until the
 * next call. Returns TSR_OK; ev->finish != TSR_FINISH_NONE on the last step. */
int tsr_gen_step(tsr_gen *g, tsr_gen_event *ev, tsr_error *err);
/* Stop early: the next step reports TSR_FINISH_CANCELLED. */
void tsr_gen_cancel(tsr_gen *g);
void tsr_gen_free(tsr_gen *g);      /* frees the sequence and its KV */

typedef struct tsr_gen_stats {
    int n_prompt;
    int n_generated;
    double prefill_seconds;
    double decode_seconds;
    double first_token_seconds;   /* from start to the first token */
    int64_t decode_passes;        /* forward passes after the prefill */
    int64_t draft_proposed;
    int64_t draft_accepted;
    int64_t verify_passes;        /* decode passes that verified at least one draft */
} tsr_gen_stats;
void tsr_gen_get_stats(const tsr_gen *g, tsr_gen_stats *out);

#endif /* TSR_RUNTIME_H */
