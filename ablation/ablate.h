/*
 * ablate.h - what each plugin of an assembly buys: the engine re-served once
 * per variant (the full assembly, the all-baseline assembly, each
 * non-baseline plugin off and alone, and with at most TSR_ABL_MAX_SUBSETS
 * of them every subset, giving exact Shapley values), each measured with
 * bench.h, each checked for quality against the all-baseline variant.
 *
 * Speedup of a variant: the geometric mean over the workload's cases of the
 * all-baseline variant's median end-to-end time over its own (robust where
 * streamed chunks reach the client in bursts; decode and prefill rates are
 * reported beside it). A plugin's share:
 *   off     = speedup(full) - speedup(full without it)
 *   alone   = speedup(only it) - 1
 *   shapley = its Shapley value of the speedup (shapley.h); the values sum
 *             to speedup(full) - 1.
 * Quality: a variant whose non-baseline plugins are all declared exact must
 * reproduce the all-baseline greedy tokens exactly (else the first differing
 * case and position); a variant with lossy plugins reports mean KL and the
 * perplexity ratio on the workload's score_text through the score path
 * (tsr_seq_forward over every row) against the sum of their declared KL
 * bounds and the product of their perplexity bounds (unless no_kl).
 */
#ifndef TSR_ABL_ABLATE_H
#define TSR_ABL_ABLATE_H

#include "../core/util/error.h"
#include "bench.h"
#include "probe.h"
#include "workload.h"

#define TSR_ABL_RESULT_SCHEMA "tessera.ablation/1"
#define TSR_ABL_MAX_SUBSETS 5   /* plugins up to which every subset runs */
#define TSR_ABL_MAX_PLUGINS 16  /* slots are fewer; bounds the masks */

typedef struct tsr_abl_plugin {
    char name[64];
    char slot[32];
    char baseline[64];           /* the slot's baseline it is replaced by */
    int exact;
    double max_mean_kl, max_ppl_ratio; /* lossy: declared bounds */
    double off, alone, shapley;  /* attributed speedup (NAN: not measured) */
    int exact_broken;            /* declared exact, its alone variant diverged */
} tsr_abl_plugin;

typedef struct tsr_abl_variant {
    char name[160];              /* full, baseline, off:P, alone:P, subset:P+Q */
    unsigned mask;               /* bit i: plugin i on */
    char assembly_file[1024];
    int refused;                 /* by the checker, or serve would not start */
    char reason[1024];
    int failed;                  /* ran but a request failed */
    tsr_bench_result bench;      /* when it ran */
    double decode_tps, prefill_tps, ttft_s, e2e_s; /* geometric means of case medians */
    double speedup;              /* end-to-end, over the all-baseline variant; NAN if unknown */
    double decode_ceiling_frac, prefill_ceiling_frac; /* mean fraction reached; NAN if unknown */
    /* quality */
    int quality_kind;            /* 0 none (baseline), 1 exact tokens, 2 lossy score, 3 lossy not scored (no_kl) */
    int quality_ok;
    char diverge_case[128];      /* exact: first differing case, "" if none */
    int diverge_pos;             /* token position in it, -1 if none */
    double mean_kl, ppl_ratio, kl_bound, ppl_bound;
    char verdict[512];
    int rounds_done;             /* rounds measured (pooled into bench) */
    char measured[32];           /* UTC of its last round, ISO 8601; "" before */
} tsr_abl_variant;

typedef struct tsr_abl_result {
    char assembly_path[1024];
    char assembly_name[256];
    char *assembly_text;         /* the assembly file as read (owned; NULL if unreadable) */
    char model[1024];            /* "" : the embedded model */
    char commit[64];             /* the source tree's HEAD at run time (+modified) */
    char built_from[64];         /* the commit the binary was built from (tsr_build_info.h) */
    char created[32];            /* UTC, ISO 8601 */
    const tsr_workload *w;       /* borrowed */
    tsr_probe_result dev;
    tsr_abl_plugin plugins[TSR_ABL_MAX_PLUGINS];
    int n_plugins;
    tsr_abl_variant *variants;
    int n_variants;
    int has_shapley;
    char shapley_note[512];
    double shapley_sum, full_minus_baseline;
    int n_threads;
    int rounds;                  /* times every variant was measured (samples pooled) */
    int resumed;                 /* variants whose rounds an earlier, interrupted run measured */
} tsr_abl_result;

typedef struct tsr_ablate_opts {
    const char *assembly;        /* required */
    const char *model;           /* NULL: embedded */
    const char *catalog;         /* NULL: default */
    const char *workload;        /* required (the CLI defaults it) */
    const char *out_dir;         /* required */
    const char *exe;             /* tessera binary; NULL: /proc/self/exe */
    const char *chat_format;     /* passed to serve */
    const char *device_json;     /* NULL: probe now */
    const char *source_dir;      /* for the git commit; NULL: current folder */
    tsr_probe_opts probe;
    int n_threads;
    int ctx;
    int progress;                /* a progress bar on stderr */
    int rounds;                  /* measure every variant this many times, the order reversed on
                                    every other round, samples pooled (0 or 1: once) */
    int no_kl;                   /* lossy variants not scored (the score path loads the model in this
                                    process once per variant: minutes for an 8B model; meaningless on
                                    random weights); exact variants still compared token for token */
    int resume;                  /* continue out_dir/result.json of an interrupted run of the same
                                    assembly, model, workload, rounds, commit and build: its measured
                                    rounds kept, its device record reused, the rest measured */
} tsr_ablate_opts;

/* Run everything and write the reports into out_dir (report.h). Refused
 * variants are listed with the reason; the rest still run. *out (may be
 * NULL) receives the result for the caller to inspect; free it with
 * tsr_abl_result_free. */
int tsr_ablate_run(const tsr_ablate_opts *o, tsr_abl_result **out, tsr_error *err);
void tsr_abl_result_free(tsr_abl_result *r);

/* The speedup figures and Shapley values from the variants' measurements
 * (called by tsr_ablate_run; exposed for tests). */
void tsr_abl_attribute(tsr_abl_result *r);

#endif
