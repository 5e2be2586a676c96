/* metrics.c - Prometheus text for GET /metrics. */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "response.h"

const double tsr_srv_hist_bounds[TSR_SRV_HIST_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

void tsr_srv_metrics_init(tsr_srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void tsr_srv_metrics_destroy(tsr_srv_metrics *m) {
    if (m) pthread_mutex_destroy(&m->mu);
}

void tsr_srv_metrics_request(tsr_srv_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_status && m->status_code[i] != status) i++;
    if (i == m->n_status && i < TSR_SRV_MAX_STATUS) m->status_code[m->n_status++] = status;
    if (i < TSR_SRV_MAX_STATUS) m->status_count[i]++;
    pthread_mutex_unlock(&m->mu);
}

void tsr_srv_metrics_finish(tsr_srv_metrics *m, tsr_srv_finish_reason why, int n_prompt,
                            int n_generated, int64_t draft_proposed, int64_t draft_accepted,
                            int64_t verify_passes) {
    pthread_mutex_lock(&m->mu);
    if ((int)why >= 0 && why < TSR_SRV_FIN_COUNT) m->finished[why]++;
    if (n_prompt > 0) m->prompt_tokens += (uint64_t)n_prompt;
    if (n_generated > 0) m->generated_tokens += (uint64_t)n_generated;
    if (draft_proposed > 0) m->draft_proposed += (uint64_t)draft_proposed;
    if (draft_accepted > 0) m->draft_accepted += (uint64_t)draft_accepted;
    if (verify_passes > 0) m->verify_passes += (uint64_t)verify_passes;
    pthread_mutex_unlock(&m->mu);
}

static void hist_add(tsr_srv_hist *h, double v) {
    int b = 0;
    while (b < TSR_SRV_HIST_BUCKETS && v > tsr_srv_hist_bounds[b]) b++;
    h->counts[b]++;
    h->count++;
    h->sum += v;
}

void tsr_srv_metrics_ttft(tsr_srv_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->ttft, s);
    pthread_mutex_unlock(&m->mu);
}

void tsr_srv_metrics_itl(tsr_srv_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_add(&m->itl, s);
    pthread_mutex_unlock(&m->mu);
}

void tsr_srv_metrics_load(tsr_srv_metrics *m, int64_t queue_depth, int64_t running) {
    pthread_mutex_lock(&m->mu);
    m->queue_depth = queue_depth;
    m->running = running;
    pthread_mutex_unlock(&m->mu);
}

void tsr_srv_metrics_kv(tsr_srv_metrics *m, uint64_t used, uint64_t capacity) {
    pthread_mutex_lock(&m->mu);
    m->kv_used = used;
    m->kv_capacity = capacity;
    pthread_mutex_unlock(&m->mu);
}

void tsr_srv_metrics_experts(tsr_srv_metrics *m, int has, uint64_t hits, uint64_t misses) {
    pthread_mutex_lock(&m->mu);
    m->has_experts = has;
    m->expert_hits = hits;
    m->expert_misses = misses;
    pthread_mutex_unlock(&m->mu);
}

static int outf(tsr_srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int outf(tsr_srv_buf *b, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    return tsr_srv_buf_append(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static int metric_head(tsr_srv_buf *b, const char *name, const char *type, const char *help) {
    return outf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static int hist_out(tsr_srv_buf *b, const char *name, const char *help, const tsr_srv_hist *h) {
    int rc = metric_head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < TSR_SRV_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        rc |= outf(b, "%s_bucket{le=\"%g\"} %llu\n", name, tsr_srv_hist_bounds[i],
                   (unsigned long long)cum);
    }
    cum += h->counts[TSR_SRV_HIST_BUCKETS];
    rc |= outf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    rc |= outf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
    return rc;
}

char *tsr_srv_metrics_render(tsr_srv_metrics *m) {
    static const char *const reasons[TSR_SRV_FIN_COUNT] = {"stop", "length", "cancelled",
                                                           "error", "rejected"};
    tsr_srv_metrics s;
    pthread_mutex_lock(&m->mu);
    s = *m;
    pthread_mutex_unlock(&m->mu);

    tsr_srv_buf b = {0};
    int rc = metric_head(&b, "tessera_requests_total", "counter",
                         "Responses of the API endpoints (/v1/...) by HTTP status.");
    for (int i = 0; i < s.n_status; i++)
        rc |= outf(&b, "tessera_requests_total{status=\"%d\"} %llu\n", s.status_code[i],
                   (unsigned long long)s.status_count[i]);
    rc |= metric_head(&b, "tessera_requests_finished_total", "counter",
                      "Accepted requests that ended, by reason (cancelled: the client went away or the shutdown timeout; rejected: refused before generating, e.g. prompt too long).");
    for (int i = 0; i < TSR_SRV_FIN_COUNT; i++)
        rc |= outf(&b, "tessera_requests_finished_total{reason=\"%s\"} %llu\n", reasons[i],
                   (unsigned long long)s.finished[i]);
    rc |= metric_head(&b, "tessera_prompt_tokens_total", "counter", "Prompt tokens processed.");
    rc |= outf(&b, "tessera_prompt_tokens_total %llu\n", (unsigned long long)s.prompt_tokens);
    rc |= metric_head(&b, "tessera_generated_tokens_total", "counter", "Tokens generated.");
    rc |= outf(&b, "tessera_generated_tokens_total %llu\n", (unsigned long long)s.generated_tokens);
    rc |= hist_out(&b, "tessera_time_to_first_token_seconds",
                   "Time from arrival (queueing included) to the first generated token.", &s.ttft);
    rc |= hist_out(&b, "tessera_inter_token_latency_seconds",
                   "Time between consecutive generated tokens of one request.", &s.itl);
    rc |= metric_head(&b, "tessera_queue_depth", "gauge", "Requests waiting for a slot.");
    rc |= outf(&b, "tessera_queue_depth %lld\n", (long long)s.queue_depth);
    rc |= metric_head(&b, "tessera_requests_running", "gauge", "Requests generating now.");
    rc |= outf(&b, "tessera_requests_running %lld\n", (long long)s.running);
    rc |= metric_head(&b, "tessera_kv_cache_used_bytes", "gauge",
                      "KV cache bytes in use (the kv_cache plugin's usage; 0 if it reports none).");
    rc |= outf(&b, "tessera_kv_cache_used_bytes %llu\n", (unsigned long long)s.kv_used);
    rc |= metric_head(&b, "tessera_kv_cache_capacity_bytes", "gauge",
                      "KV cache bytes reserved.");
    rc |= outf(&b, "tessera_kv_cache_capacity_bytes %llu\n", (unsigned long long)s.kv_capacity);
    rc |= metric_head(&b, "tessera_kv_cache_usage_ratio", "gauge", "Used over reserved KV bytes.");
    rc |= outf(&b, "tessera_kv_cache_usage_ratio %.6g\n",
               s.kv_capacity ? (double)s.kv_used / (double)s.kv_capacity : 0.0);
    rc |= metric_head(&b, "tessera_draft_proposed_tokens_total", "counter",
                      "Tokens proposed by the drafter.");
    rc |= outf(&b, "tessera_draft_proposed_tokens_total %llu\n",
               (unsigned long long)s.draft_proposed);
    rc |= metric_head(&b, "tessera_draft_accepted_tokens_total", "counter",
                      "Drafted tokens the model accepted.");
    rc |= outf(&b, "tessera_draft_accepted_tokens_total %llu\n",
               (unsigned long long)s.draft_accepted);
    rc |= metric_head(&b, "tessera_draft_verify_passes_total", "counter",
                      "Verification passes of drafted tokens.");
    rc |= outf(&b, "tessera_draft_verify_passes_total %llu\n", (unsigned long long)s.verify_passes);
    rc |= metric_head(&b, "tessera_draft_acceptance_length", "gauge",
                      "Mean drafted tokens accepted per verification pass (0 without a drafter).");
    rc |= outf(&b, "tessera_draft_acceptance_length %.6g\n",
               s.verify_passes ? (double)s.draft_accepted / (double)s.verify_passes : 0.0);
    rc |= metric_head(&b, "tessera_expert_cache_hit_rate", "gauge",
                      s.has_experts ? "Expert-cache hits over lookups since start."
                                    : "Expert-cache hits over lookups; 0: this engine has no "
                                      "expert cache (dense model) or it reports no statistics.");
    uint64_t lookups = s.expert_hits + s.expert_misses;
    rc |= outf(&b, "tessera_expert_cache_hit_rate %.6g\n",
               s.has_experts && lookups ? (double)s.expert_hits / (double)lookups : 0.0);
    rc |= metric_head(&b, "tessera_expert_cache_lookups_total", "counter",
                      "Expert-cache lookups by result.");
    rc |= outf(&b, "tessera_expert_cache_lookups_total{result=\"hit\"} %llu\n",
               (unsigned long long)s.expert_hits);
    rc |= outf(&b, "tessera_expert_cache_lookups_total{result=\"miss\"} %llu\n",
               (unsigned long long)s.expert_misses);
    if (rc) {
        tsr_srv_buf_free(&b);
        return NULL;
    }
    return b.data;
}
