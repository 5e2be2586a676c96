/*
 * sched.h - the scheduler: a FIFO of waiting requests and one engine
 * thread that advances up to `parallel` running generations round-robin,
 * one step each in turn.
 *
 * The engine is reached only through a tsr_srv_backend (backend_runtime.c
 * wires the model runtime; tests use a fake one), and every backend call is
 * made on the engine thread, because the runtime is not thread-safe. HTTP
 * threads submit jobs, wait for their events, and cancel them when the
 * client goes away; the engine thread frees a cancelled job's generation
 * (and so its KV) at its next turn.
 */
#ifndef TSR_SRV_SCHED_H
#define TSR_SRV_SCHED_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "../runtime/runtime.h"
#include "metrics.h"
#include "request.h"
#include "response.h"

/* The engine behind the server. All members are called on the engine
 * thread only. */
typedef struct tsr_srv_backend {
    void *ctx;
    const char *model_id;  /* name served in /v1/models and responses */
    int n_ctx;             /* context length in tokens */
    /* required: the prompt's token ids (chat template + tokenizer, or the
     * request's ids checked against the vocabulary); *ids malloc'ed. A bad
     * request fills e with a 400. */
    int (*prompt)(void *ctx, const tsr_srv_request *rq, int32_t **ids, int *n_ids,
                  tsr_srv_error *e);
    /* required: start a generation (TSR_ERR_RANGE: does not fit the context). */
    int (*start)(void *ctx, const int32_t *ids, int n_ids, const tsr_gen_params *p, void **gen,
                 tsr_error *err);
    /* required: one step; ev valid until the next call. */
    int (*step)(void *ctx, void *gen, tsr_gen_event *ev, tsr_error *err);
    /* required: free a generation (and its KV). */
    void (*free_gen)(void *ctx, void *gen);
    /* optional: drafter statistics of a generation. */
    void (*stats)(void *ctx, void *gen, tsr_gen_stats *out);
    /* required: the text of a token as raw bytes (for log-probabilities). */
    size_t (*token_text)(void *ctx, int32_t id, char *buf, size_t size);
    /* optional: KV bytes in use and reserved. */
    void (*kv_usage)(void *ctx, uint64_t *used, uint64_t *capacity);
    /* optional: expert-cache counters; returns 0 when the engine has one. */
    int (*expert_stats)(void *ctx, uint64_t *hits, uint64_t *misses);
} tsr_srv_backend;

typedef enum tsr_srv_job_state {
    TSR_SRV_JOB_QUEUED = 0,
    TSR_SRV_JOB_RUNNING = 1,  /* started: the response is 200 */
    TSR_SRV_JOB_DONE = 2      /* finished, failed or refused (see status) */
} tsr_srv_job_state;

typedef struct tsr_srv_sched tsr_srv_sched;

/* One request as both sides see it. Fields under "shared" are guarded by
 * the scheduler's lock; read them through tsr_srv_job_wait / _take. */
typedef struct tsr_srv_job {
    tsr_srv_request rq;             /* owned; immutable once submitted */
    char id[48];                    /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;
    double t_arrival;
    /* shared */
    int refs;
    pthread_cond_t cond;
    tsr_srv_job_state state;
    int cancelled;
    int status;                     /* HTTP status once decided (200 or the error's) */
    tsr_srv_error error;            /* when status != 200, or a failure after 200 */
    tsr_srv_buf text;               /* text not yet taken by the writer */
    json_t *logprobs;               /* chat-layout entries not yet taken (NULL unless asked) */
    size_t text_taken;              /* bytes of text taken so far (completion offsets) */
    int n_prompt, n_generated;
    tsr_finish finish;
    /* engine thread only */
    void *gen;
    double t_last_token;
    struct tsr_srv_job *next;
} tsr_srv_job;

typedef struct tsr_srv_sched_opts {
    int parallel;   /* >= 1 */
    int queue;      /* waiting requests beyond which submit answers 429 */
} tsr_srv_sched_opts;

/* Starts the engine thread. The backend and metrics are borrowed. */
int tsr_srv_sched_new(const tsr_srv_backend *be, const tsr_srv_sched_opts *o, tsr_srv_metrics *m,
                      tsr_srv_sched **out, tsr_error *err);
/* Stops the engine thread: cancels what is left, frees every generation. */
void tsr_srv_sched_free(tsr_srv_sched *s);

/* Take ownership of rq (moved: *rq is zeroed) and queue it. Returns a job
 * holding one reference for the caller, or NULL with e set (429 when the
 * queue is full, 503 when shutting down or after a fatal error). */
tsr_srv_job *tsr_srv_submit(tsr_srv_sched *s, tsr_srv_request *rq, tsr_srv_error *e);

/* Block until the job left the queue (state RUNNING or DONE) or
 * timeout_ms passed; returns the state. */
tsr_srv_job_state tsr_srv_job_wait_started(tsr_srv_sched *s, tsr_srv_job *j, int timeout_ms);

/* What the writer takes from a job: the text and log-probabilities made
 * since the last take, and whether it finished. */
typedef struct tsr_srv_take {
    char *text;          /* malloc'ed (may be NULL when len is 0) */
    size_t len;
    size_t text_offset;  /* bytes of text before this piece */
    json_t *logprobs;    /* new reference or NULL */
    int done;            /* state DONE: finish, status, error and counts are final */
    tsr_finish finish;
    int status;
    tsr_srv_error error;
    int n_prompt, n_generated;
} tsr_srv_take;

/* Wait up to timeout_ms for new output (or the end), then take it. Returns
 * 1 if anything was taken or the job is done, 0 on timeout. */
int tsr_srv_job_take(tsr_srv_sched *s, tsr_srv_job *j, int timeout_ms, tsr_srv_take *out);
void tsr_srv_take_clear(tsr_srv_take *t);

/* The client went away (or the server gives up on the job). */
void tsr_srv_job_cancel(tsr_srv_sched *s, tsr_srv_job *j);
void tsr_srv_job_release(tsr_srv_sched *s, tsr_srv_job *j);

/* Refuse new jobs from now on (503). */
void tsr_srv_sched_stop_accepting(tsr_srv_sched *s);
/* Waiting plus running jobs. */
int tsr_srv_sched_active(tsr_srv_sched *s);
/* Cancel every job (shutdown timeout). */
void tsr_srv_sched_cancel_all(tsr_srv_sched *s);
/* A backend step failed with a device error: /health reports 503 and the
 * server should exit non-zero. */
int tsr_srv_sched_fatal(tsr_srv_sched *s);

#endif /* TSR_SRV_SCHED_H */
