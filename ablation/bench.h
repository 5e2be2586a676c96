/*
 * bench.h - measuring a served engine through its HTTP API (libcurl,
 * streaming chat completions parsed as server-sent events): per case the
 * decode and prefill rates, time to first token and end-to-end time, each
 * the median of repetitions after warm-up, with min and max, next to its
 * ceiling on this machine (probe.h) and the fraction reached.
 *
 * Ceilings: decode tok/s <= read bandwidth / (weight bytes read per token +
 * KV bytes per token x the context at mid-generation); prefill tok/s <=
 * matmul rate / (FLOPs per token at half the prompt's context).
 */
#ifndef TSR_ABL_BENCH_H
#define TSR_ABL_BENCH_H

#include <jansson.h>
#include <sys/types.h>

#include "../core/util/error.h"
#include "probe.h"
#include "workload.h"

/* ---- a tessera serve child process ------------------------------------- */

typedef struct tsr_serve_spec {
    const char *exe;          /* the tessera binary; NULL: /proc/self/exe */
    const char *assembly;     /* NULL: serve's default */
    const char *model;        /* NULL: the embedded model */
    const char *catalog;      /* NULL: serve's default */
    const char *chat_format;  /* NULL: the model's own template */
    int n_threads;            /* 0: serve's default */
    int ctx;                  /* 0: the model's */
    const char *log_path;     /* where the child's stderr goes (required) */
    double timeout_s;         /* for /health to answer 200; 0: 300 */
} tsr_serve_spec;

typedef struct tsr_served {
    pid_t pid;                /* 0: none */
    int port;
    char url[64];             /* http://127.0.0.1:PORT */
} tsr_served;

/* Start `tessera serve ... --port 0` on 127.0.0.1, read the port it prints
 * to its log and wait for /health. On failure the child is gone and err
 * holds the reason with the log's last lines (a refused assembly, a model
 * that failed to load). */
int tsr_serve_spawn(const tsr_serve_spec *s, tsr_served *out, tsr_error *err);
/* SIGTERM, wait (SIGKILL after 10 s). Returns the child's exit status. */
int tsr_serve_stop(tsr_served *s);

/* ---- what a served engine reads and computes per token ------------------- */

typedef struct tsr_engine_figures {
    int known;
    char source[32];                 /* "GET /v1/engine", "local", "" */
    char assembly[256];
    int device;                      /* tsr_device_kind the engine runs on: whose ceilings apply */
    double weight_bytes_per_token;   /* weights actually read per decode token */
    double kv_bytes_per_token;       /* KV bytes written (and later read) per token */
    double flops_per_token;          /* matmul FLOPs per token, context excluded */
    double attn_flops_per_ctx_token; /* attention FLOPs per token per token of context */
    double n_params;                 /* matmul parameters used per token */
} tsr_engine_figures;

/* The figures as JSON (assembly, device and the five numbers; no source):
 * GET /v1/engine's and result.json's; NULL on no memory. */
json_t *tsr_engine_figures_to_json(const tsr_engine_figures *f);
/* Read back (source left ""): the four per-token figures and the device
 * are required (TSR_ERR_FORMAT naming the field), attention FLOPs optional. */
int tsr_engine_figures_from_json(const json_t *j, tsr_engine_figures *f, tsr_error *err);
/* GET url/v1/engine (404: known = 0, TSR_OK; a body without the figures or
 * the device: TSR_ERR_FORMAT naming the field). */
int tsr_engine_figures_http(const char *url, tsr_engine_figures *f, tsr_error *err);
/* Load the engine in this process (same assembly, model, catalog) and read
 * them from the runtime. */
int tsr_engine_figures_local(const tsr_serve_spec *s, tsr_engine_figures *f, tsr_error *err);

struct tsr_model;
/* The same from a loaded model (runs 16 tokens through a scratch sequence
 * to measure the kv_cache plugin's bytes per token). */
int tsr_engine_figures_of(struct tsr_model *m, tsr_engine_figures *f, tsr_error *err);
/* The body of tessera serve's GET /v1/engine: assembly, plugins (slot,
 * plugin, version, exactness, baseline) and the figures above; malloc'ed,
 * NULL on failure. */
char *tsr_engine_info_json(struct tsr_model *m, tsr_error *err);

/* ---- one benchmark ---------------------------------------------------- */

typedef struct tsr_bench_sample {
    double ttft_s, e2e_s, decode_tps, prefill_tps; /* decode_tps 0 with < 2 tokens */
    int n_prompt, n_gen;
} tsr_bench_sample;

typedef struct tsr_stat3 { double med, min, max; } tsr_stat3;

typedef struct tsr_bench_case {
    char name[128];
    char kind[32];
    tsr_bench_sample *samples;       /* repeats (warm-up runs not kept) */
    int n_samples;
    tsr_stat3 decode_tps, prefill_tps, ttft_s, e2e_s;
    int n_prompt, n_gen;             /* of the first repetition */
    json_t *tokens;                  /* token texts of the first (warm-up) run, asked with logprobs */
    char *text;                      /* its text, which every timed run repeated */
    double decode_ceiling_tps, prefill_ceiling_tps; /* 0: unknown */
    double draft_accept_per_pass;    /* accepted drafted tokens per verify pass; -1: no drafting */
    double expert_hit_rate;          /* -1: no expert cache activity */
} tsr_bench_case;

typedef struct tsr_bench_result {
    tsr_bench_case *cases;
    int n_cases;
    tsr_engine_figures fig;
} tsr_bench_result;

/* Called before each request: case index, "warm-up" or "run", repetition. */
typedef void (*tsr_bench_progress_fn)(void *ud, int case_i, int n_cases, const char *case_name,
                                      int rep, int n_reps);

typedef struct tsr_bench_opts {
    const char *url;                 /* the server */
    const tsr_workload *w;
    const tsr_probe_result *dev;     /* NULL: no ceilings */
    const tsr_engine_figures *fig;   /* NULL or !known: no ceilings */
    tsr_bench_progress_fn progress;
    void *progress_ud;
    double request_timeout_s;        /* 0: 600 */
} tsr_bench_opts;

int tsr_bench_run(const tsr_bench_opts *o, tsr_bench_result *out, tsr_error *err);
void tsr_bench_result_free(tsr_bench_result *r);

/* ---- pieces, exposed for tests ----------------------------------------- */

/* One streamed chat completion. Fills s, *tokens (new array of token
 * texts: empty unless want_tokens, which asks for logprobs) and *text
 * (malloc'ed). HTTP errors give TSR_ERR_REFUSED with the status and the
 * server's message. */
int tsr_bench_request(const char *url, const tsr_wl_case *c, double timeout_s, int want_tokens,
                      tsr_bench_sample *s, json_t **tokens, char **text, tsr_error *err);
/* Value of one sample line of Prometheus text ("name" or "name{labels}"
 * exactly as written); 0 if found. */
int tsr_prom_value(const char *text, const char *series, double *out);
/* Median, min and max of n values (v reordered). */
tsr_stat3 tsr_stat3_of(double *v, int n);
/* Ceilings of a case for figures f measured on machine d (0 when unknown):
 * decode at the read rate over the bytes a token reads, prefill at the matmul
 * rate over its FLOPs; the host's rates (read, sgemm) for a CPU engine, the
 * GPU's (read, bf16 matmul) for a CUDA one. */
void tsr_bench_ceilings(const tsr_engine_figures *f, const tsr_probe_result *d, int n_prompt,
                        int n_gen, double *decode_tps, double *prefill_tps);

/* Pool a second measurement of the same workload into a first (rounds of
 * an ablation): each case's samples appended, its medians, min and max
 * recomputed over all of them, drafting and expert-cache rates averaged.
 * Frees more whatever the outcome; into keeps the first round's token texts. */
int tsr_bench_merge(tsr_bench_result *into, tsr_bench_result *more, tsr_error *err);

#endif
