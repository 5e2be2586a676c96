/*
 * metrics.h - the server's counters, gauges and histograms, rendered in the
 * Prometheus text exposition format for GET /metrics. Thread-safe: HTTP
 * threads and the engine thread update it under its own lock.
 */
#ifndef TSR_SRV_METRICS_H
#define TSR_SRV_METRICS_H

#include <pthread.h>
#include <stdint.h>

#define TSR_SRV_HIST_BUCKETS 14
#define TSR_SRV_MAX_STATUS 16

typedef struct tsr_srv_hist {
    uint64_t counts[TSR_SRV_HIST_BUCKETS + 1]; /* per bucket (not cumulative); last: +Inf */
    uint64_t count;
    double sum;
} tsr_srv_hist;

typedef enum tsr_srv_finish_reason {
    TSR_SRV_FIN_STOP = 0,
    TSR_SRV_FIN_LENGTH = 1,
    TSR_SRV_FIN_CANCELLED = 2,
    TSR_SRV_FIN_ERROR = 3,     /* failed after it started */
    TSR_SRV_FIN_REJECTED = 4,  /* refused before it started (prompt too long, ...) */
    TSR_SRV_FIN_COUNT
} tsr_srv_finish_reason;

typedef struct tsr_srv_metrics {
    pthread_mutex_t mu;
    int status_code[TSR_SRV_MAX_STATUS];
    uint64_t status_count[TSR_SRV_MAX_STATUS];
    int n_status;
    uint64_t finished[TSR_SRV_FIN_COUNT];
    uint64_t prompt_tokens, generated_tokens;
    tsr_srv_hist ttft, itl;
    int64_t queue_depth, running;
    uint64_t kv_used, kv_capacity;
    uint64_t draft_proposed, draft_accepted, verify_passes;
    int has_experts;
    uint64_t expert_hits, expert_misses;
} tsr_srv_metrics;

/* Upper bounds (seconds) of the latency histograms' buckets. */
extern const double tsr_srv_hist_bounds[TSR_SRV_HIST_BUCKETS];

void tsr_srv_metrics_init(tsr_srv_metrics *m);
void tsr_srv_metrics_destroy(tsr_srv_metrics *m);

/* A response of an API endpoint with this HTTP status. */
void tsr_srv_metrics_request(tsr_srv_metrics *m, int status);
/* A generation that ended, with its token counts and drafter statistics. */
void tsr_srv_metrics_finish(tsr_srv_metrics *m, tsr_srv_finish_reason why, int n_prompt,
                            int n_generated, int64_t draft_proposed, int64_t draft_accepted,
                            int64_t verify_passes);
void tsr_srv_metrics_ttft(tsr_srv_metrics *m, double seconds);
void tsr_srv_metrics_itl(tsr_srv_metrics *m, double seconds);
void tsr_srv_metrics_load(tsr_srv_metrics *m, int64_t queue_depth, int64_t running);
void tsr_srv_metrics_kv(tsr_srv_metrics *m, uint64_t used, uint64_t capacity);
/* has: the engine has an expert cache (a mixture-of-experts model). */
void tsr_srv_metrics_experts(tsr_srv_metrics *m, int has, uint64_t hits, uint64_t misses);

/* The whole text, malloc'ed (caller frees); NULL when out of memory. */
char *tsr_srv_metrics_render(tsr_srv_metrics *m);

#endif /* TSR_SRV_METRICS_H */
