#include "bench.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../core/host/manifest.h"
#include "../core/runtime/runtime.h"
#include "sse.h"
#include "../core/util/clock.h"

static void sleep_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

/* ---- growing byte buffer ---- */
typedef struct bbuf { char *p; size_t n, cap, limit; } bbuf;

static size_t bbuf_write(char *ptr, size_t size, size_t nm, void *ud) {
    bbuf *b = ud;
    size_t n = size * nm;
    size_t keep = b->n + n > b->limit ? (b->limit > b->n ? b->limit - b->n : 0) : n;
    if (keep) {
        if (b->n + keep + 1 > b->cap) {
            size_t c = b->cap ? b->cap : 4096;
            while (c < b->n + keep + 1) c *= 2;
            char *g = realloc(b->p, c);
            if (!g) return 0;
            b->p = g;
            b->cap = c;
        }
        memcpy(b->p + b->n, ptr, keep);
        b->n += keep;
        b->p[b->n] = 0;
    }
    return n;
}

/* GET url+path into *body (malloc'ed); *status the HTTP status. */
static int http_get(const char *url, const char *path, double timeout_s, long *status, char **body,
                    tsr_error *err) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", url, path);
    CURL *c = curl_easy_init();
    if (!c) return tsr_error_set(err, TSR_ERR_NOMEM, "curl_easy_init failed");
    bbuf b = {.limit = 16u << 20};
    curl_easy_setopt(c, CURLOPT_URL, full);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, bbuf_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    CURLcode rc = curl_easy_perform(c);
    *status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) {
        free(b.p);
        return tsr_error_set(err, TSR_ERR_IO, "GET %s: %s", full, curl_easy_strerror(rc));
    }
    *body = b.p ? b.p : strdup("");
    return *body ? TSR_OK : tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
}

/* ---- the serve child ---- */

static void log_tail(const char *path, char *out, size_t size) {
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    long from = n > 600 ? n - 600 : 0;
    fseek(f, from, SEEK_SET);
    size_t r = fread(out, 1, size - 1, f);
    out[r] = 0;
    fclose(f);
    for (char *p = out; *p; p++)
        if (*p == '\n') *p = ' ';
}

int tsr_serve_spawn(const tsr_serve_spec *s, tsr_served *out, tsr_error *err) {
    memset(out, 0, sizeof *out);
    if (!s->log_path) return tsr_error_set(err, TSR_ERR_INVALID, "serve: no log path");
    const char *argv[32];
    int k = 0;
    char thr[16], ctx[16];
    argv[k++] = "tessera";
    argv[k++] = "serve";
    if (s->assembly) argv[k++] = s->assembly;
    if (s->model) argv[k++] = "--model", argv[k++] = s->model;
    if (s->catalog) argv[k++] = "--catalog", argv[k++] = s->catalog;
    if (s->chat_format) argv[k++] = "--chat-format", argv[k++] = s->chat_format;
    if (s->n_threads > 0) {
        snprintf(thr, sizeof thr, "%d", s->n_threads);
        argv[k++] = "--threads", argv[k++] = thr;
    }
    if (s->ctx > 0) {
        snprintf(ctx, sizeof ctx, "%d", s->ctx);
        argv[k++] = "--ctx", argv[k++] = ctx;
    }
    argv[k++] = "--host", argv[k++] = "127.0.0.1";
    argv[k++] = "--port", argv[k++] = "0";
    argv[k++] = "--parallel", argv[k++] = "1";
    argv[k++] = "--shutdown-timeout", argv[k++] = "5";
    argv[k] = NULL;
    const char *exe = s->exe ? s->exe : "/proc/self/exe";
    int fd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return tsr_error_set(err, TSR_ERR_IO, "serve: cannot create %s: %s", s->log_path, strerror(errno));
    fflush(NULL);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        return tsr_error_set(err, TSR_ERR_IO, "serve: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        /* the server goes when its parent does (an ablation killed between
         * variants leaves no server holding the model, the port or the GPU) */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) dup2(nul, 0), dup2(nul, 1);
        dup2(fd, 2);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(exe, (char *const *)argv);
        dprintf(2, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    close(fd);
    out->pid = pid;
    double t0 = tsr_now_seconds(), limit = s->timeout_s > 0 ? s->timeout_s : 300;
    char tail[700];
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            out->pid = 0;
            log_tail(s->log_path, tail, sizeof tail);
            return tsr_error_set(err, TSR_ERR_REFUSED, "tessera serve exited (status %d) before it was ready: %s",
                                 WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), tail);
        }
        if (!out->port) {
            FILE *f = fopen(s->log_path, "r");
            char line[1024];
            while (f && fgets(line, sizeof line, f)) {
                const char *p = strstr(line, "listening on http://127.0.0.1:");
                if (p) out->port = atoi(p + strlen("listening on http://127.0.0.1:"));
            }
            if (f) fclose(f);
            if (out->port > 0) snprintf(out->url, sizeof out->url, "http://127.0.0.1:%d", out->port);
        }
        if (out->port > 0) {
            long code = 0;
            char *body = NULL;
            tsr_error e2;
            tsr_error_clear(&e2);
            if (http_get(out->url, "/health", 5, &code, &body, &e2) == TSR_OK) {
                free(body);
                if (code == 200) return TSR_OK;
            }
        }
        if (tsr_now_seconds() - t0 > limit) {
            log_tail(s->log_path, tail, sizeof tail);
            tsr_serve_stop(out);
            return tsr_error_set(err, TSR_ERR_IO, "tessera serve not ready after %g s: %s", limit, tail);
        }
        sleep_s(0.02);
    }
}

int tsr_serve_stop(tsr_served *s) {
    if (!s || s->pid <= 0) return 0;
    kill(s->pid, SIGTERM);
    int st = 0;
    double t0 = tsr_now_seconds();
    for (;;) {
        pid_t w = waitpid(s->pid, &st, WNOHANG);
        if (w == s->pid || w < 0) break;
        if (tsr_now_seconds() - t0 > 10) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            break;
        }
        sleep_s(0.01);
    }
    s->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* ---- engine figures ---- */

static double matmul_params(const tsr_model_config *c) {
    double hd = c->head_dim, h = c->hidden;
    double attn = h * c->n_heads * hd * 2 + h * c->n_kv_heads * hd * 2; /* q, o; k, v */
    double mlp;
    if (c->n_experts > 0)
        mlp = (double)c->n_experts_used * 3 * h * c->expert_ffn + h * c->n_experts;
    else
        mlp = 3 * h * c->ffn;
    return (double)c->n_layers * (attn + mlp) + (double)c->vocab * h;
}

json_t *tsr_engine_figures_to_json(const tsr_engine_figures *f) {
    return json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:o}", "assembly", f->assembly, "device",
                     tsr_device_name(f->device), "weight_bytes_per_token", tsr_jnum(f->weight_bytes_per_token),
                     "kv_bytes_per_token", tsr_jnum(f->kv_bytes_per_token), "flops_per_token",
                     tsr_jnum(f->flops_per_token), "attn_flops_per_ctx_token",
                     tsr_jnum(f->attn_flops_per_ctx_token), "n_params", tsr_jnum(f->n_params));
}

int tsr_engine_figures_from_json(const json_t *j, tsr_engine_figures *f, tsr_error *err) {
    memset(f, 0, sizeof *f);
    const char *keys[] = {"weight_bytes_per_token", "kv_bytes_per_token", "flops_per_token", "n_params"};
    double *dst[] = {&f->weight_bytes_per_token, &f->kv_bytes_per_token, &f->flops_per_token, &f->n_params};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(j, keys[i]);
        if (!json_is_number(v)) return tsr_error_set(err, TSR_ERR_FORMAT, "%s missing or not a number", keys[i]);
        *dst[i] = json_number_value(v);
    }
    json_t *a = json_object_get(j, "attn_flops_per_ctx_token");
    if (json_is_number(a)) f->attn_flops_per_ctx_token = json_number_value(a);
    a = json_object_get(j, "assembly");
    snprintf(f->assembly, sizeof f->assembly, "%s", json_is_string(a) ? json_string_value(a) : "");
    a = json_object_get(j, "device");
    if ((f->device = json_is_string(a) ? tsr_device_from_name(json_string_value(a)) : -1) < 0)
        return tsr_error_set(err, TSR_ERR_FORMAT, "device missing or not \"cpu\" or \"cuda\"");
    f->known = 1;
    return TSR_OK;
}

int tsr_engine_figures_http(const char *url, tsr_engine_figures *f, tsr_error *err) {
    memset(f, 0, sizeof *f);
    long code;
    char *body = NULL;
    int rc = http_get(url, "/v1/engine", 30, &code, &body, err);
    if (rc) return rc;
    if (code != 200) {
        free(body);
        return TSR_OK;
    }
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    rc = tsr_engine_figures_from_json(j, f, err);
    json_decref(j);
    if (rc) {
        f->known = 0;
        tsr_error_prefix(err, "GET /v1/engine");
        return rc;
    }
    snprintf(f->source, sizeof f->source, "GET /v1/engine");
    return TSR_OK;
}

int tsr_engine_figures_of(tsr_model *m, tsr_engine_figures *f, tsr_error *err) {
    memset(f, 0, sizeof *f);
    const tsr_model_config *c = tsr_model_get_config(m);
    f->weight_bytes_per_token = (double)tsr_model_weight_bytes_per_token(m);
    f->n_params = matmul_params(c);
    f->flops_per_token = 2 * f->n_params;
    f->attn_flops_per_ctx_token = 4.0 * c->n_layers * c->n_heads * c->head_dim;
    /* KV bytes per token: the kv_cache plugin's usage after n/2 and after n tokens */
    int n = tsr_model_ctx(m) < 16 ? tsr_model_ctx(m) : 16, h = n / 2;
    int rc = TSR_OK;
    if (h >= 1) {
        tsr_seq *q = NULL;
        int32_t toks[16];
        for (int i = 0; i < n; i++) toks[i] = (int32_t)(1 + i % (c->vocab > 2 ? c->vocab - 1 : 1));
        uint64_t u1 = 0, u2 = 0, cap;
        rc = tsr_seq_new(m, n, &q, err);
        if (!rc) rc = tsr_seq_forward(q, toks, h, NULL, 0, err);
        if (!rc) tsr_model_kv_usage(m, &u1, &cap);
        if (!rc) rc = tsr_seq_forward(q, toks + h, n - h, NULL, 0, err);
        if (!rc) tsr_model_kv_usage(m, &u2, &cap);
        tsr_seq_free(q);
        if (!rc) /* reserved up front: the reservation over the tokens it holds */
            f->kv_bytes_per_token = u2 > u1 ? (double)(u2 - u1) / (n - h) : (double)u2 / n;
    }
    if (rc) return rc;
    snprintf(f->assembly, sizeof f->assembly, "%s", tsr_engine_name(tsr_model_get_engine(m)));
    f->device = tsr_engine_device(tsr_model_get_engine(m));
    snprintf(f->source, sizeof f->source, "local");
    f->known = 1;
    return TSR_OK;
}

int tsr_engine_figures_local(const tsr_serve_spec *s, tsr_engine_figures *f, tsr_error *err) {
    memset(f, 0, sizeof *f);
    tsr_model_opts mo = {.model_path = s->model, .assembly_path = s->assembly, .catalog_dir = s->catalog,
                         .n_threads = 1, .max_ctx = 64, .no_tokenizer = 1};
    tsr_model *m = NULL;
    int rc = tsr_model_load(&mo, &m, err);
    if (rc) return rc;
    rc = tsr_engine_figures_of(m, f, err);
    tsr_model_free(m);
    return rc;
}

char *tsr_engine_info_json(tsr_model *m, tsr_error *err) {
    tsr_engine_figures f;
    int rc = tsr_engine_figures_of(m, &f, err);
    if (rc) return NULL;
    tsr_engine *e = tsr_model_get_engine(m);
    json_t *plugins = json_array();
    for (int s = 0; s < TSR_SLOT_COUNT; s++) {
        const tsr_slot_ref *r = tsr_engine_slot(e, (tsr_slot)s);
        if (!r || !r->plugin) continue;
        json_array_append_new(plugins, json_pack("{s:s, s:s, s:s, s:s, s:b}", "slot", tsr_slot_name((tsr_slot)s),
                                                 "plugin", r->plugin, "version", r->version ? r->version : "",
                                                 "exactness", r->exact ? "exact" : "lossy", "baseline",
                                                 r->baseline));
    }
    json_t *j = tsr_engine_figures_to_json(&f);
    if (j) {
        json_object_set_new(j, "plugins", plugins);
        json_object_set_new(j, "note", json_string("flops_per_token: 2 x matmul parameters used per token; "
                                                   "attention adds attn_flops_per_ctx_token per token of "
                                                   "context; kv_bytes_per_token measured from the kv_cache "
                                                   "plugin's usage at start-up"));
    } else
        json_decref(plugins);
    char *out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!out) tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    return out;
}

void tsr_bench_ceilings(const tsr_engine_figures *f, const tsr_probe_result *d, int n_prompt, int n_gen,
                        double *decode_tps, double *prefill_tps) {
    *decode_tps = *prefill_tps = 0;
    if (!f || !f->known || !d) return;
    /* the machine the engine runs on: the host's read rate and sgemm, or the
     * GPU's read rate and bf16 matmul (NAN where not measured: unknown) */
    const int gpu = f->device == TSR_DEVICE_CUDA;
    const double gbs = gpu ? (d->have_gpu ? d->gpu_read_gbs : NAN) : d->read_gbs;
    const double gflops = gpu ? (d->have_gpu ? d->gpu_bf16_tflops * 1e3 : NAN) : d->gemm_gflops;
    double ctx = n_prompt + n_gen / 2.0;
    double bytes = f->weight_bytes_per_token + f->kv_bytes_per_token * ctx;
    if (gbs > 0 && bytes > 0) *decode_tps = gbs * 1e9 / bytes;
    double flops = f->flops_per_token + f->attn_flops_per_ctx_token * (n_prompt / 2.0);
    if (gflops > 0 && flops > 0) *prefill_tps = gflops * 1e9 / flops;
}

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

tsr_stat3 tsr_stat3_of(double *v, int n) {
    tsr_stat3 s = {0, 0, 0};
    if (n <= 0) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.min = v[0];
    s.max = v[n - 1];
    s.med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return s;
}

int tsr_prom_value(const char *text, const char *series, double *out) {
    size_t n = strlen(series);
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        if (l[0] != '#' && !strncmp(l, series, n) && l[n] == ' ') {
            char *end;
            double v = strtod(l + n + 1, &end);
            if (end != l + n + 1) {
                *out = v;
                return 0;
            }
        }
        l = e ? e + 1 : NULL;
    }
    return -1;
}

/* ---- one streamed request ---- */

typedef struct stream_ctx {
    double t0, t_first, t_last;
    int n_prompt, n_gen, done, failed;
    char failure[512];
    json_t *tokens;
    bbuf text;
    bbuf raw; /* the first bytes, for error bodies */
    tsr_sse sse;
    tsr_error sse_err;
    int sse_rc;
} stream_ctx;

static int on_event(void *ud, const char *type, const char *data, size_t len) {
    stream_ctx *s = ud;
    (void)type;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = 1;
        return 0;
    }
    json_error_t je;
    json_t *j = json_loadb(data, len, 0, &je);
    if (!j) {
        s->failed = 1;
        snprintf(s->failure, sizeof s->failure, "a stream event is not JSON (%s): %.80s", je.text, data);
        return 1;
    }
    json_t *e = json_object_get(j, "error");
    if (e) {
        json_t *m = json_object_get(e, "message");
        s->failed = 1;
        snprintf(s->failure, sizeof s->failure, "error event: %s", json_is_string(m) ? json_string_value(m) : "?");
        json_decref(j);
        return 1;
    }
    double t = tsr_now_seconds();
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    if (ch) {
        json_t *delta = json_object_get(ch, "delta");
        json_t *content = json_object_get(delta, "content");
        json_t *lp = json_object_get(json_object_get(ch, "logprobs"), "content");
        size_t ntok = json_is_array(lp) ? json_array_size(lp) : 0;
        for (size_t i = 0; i < ntok; i++) {
            json_t *tk = json_object_get(json_array_get(lp, i), "token");
            json_array_append_new(s->tokens, json_string(json_is_string(tk) ? json_string_value(tk) : ""));
        }
        int has_text = json_is_string(content) && json_string_length(content) > 0;
        if (has_text) bbuf_write((char *)json_string_value(content), 1, json_string_length(content), &s->text);
        if (ntok || has_text) {
            if (s->t_first == 0) s->t_first = t;
            s->t_last = t;
        }
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        s->n_prompt = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
        s->n_gen = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    }
    json_decref(j);
    return 0;
}

static size_t stream_write(char *ptr, size_t size, size_t nm, void *ud) {
    stream_ctx *s = ud;
    size_t n = size * nm;
    bbuf_write(ptr, 1, n, &s->raw);
    if (s->sse_rc == TSR_OK) s->sse_rc = tsr_sse_feed(&s->sse, ptr, n, &s->sse_err);
    return n;
}

int tsr_bench_request(const char *url, const tsr_wl_case *c, double timeout_s, int want_tokens,
                      tsr_bench_sample *out, json_t **tokens, char **text, tsr_error *err) {
    memset(out, 0, sizeof *out);
    *tokens = NULL;
    *text = NULL;
    json_t *req = json_pack("{s:s, s:O, s:i, s:f, s:b, s:{s:b}, s:b}", "model", "tessera", "messages",
                            c->messages, "max_tokens", c->max_tokens, "temperature", 0.0, "stream", 1,
                            "stream_options", "include_usage", 1, "logprobs", want_tokens);
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    stream_ctx s;
    memset(&s, 0, sizeof s);
    s.raw.limit = 2048;
    s.text.limit = 64u << 20;
    s.tokens = json_array();
    tsr_sse_init(&s.sse, on_event, &s);
    tsr_error_clear(&s.sse_err);
    char full[512];
    snprintf(full, sizeof full, "%s/v1/chat/completions", url);
    CURL *h = curl_easy_init();
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    int rc = TSR_OK;
    if (!h || !hd || !s.tokens) {
        rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        goto done;
    }
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stream_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)((timeout_s > 0 ? timeout_s : 600) * 1000));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    s.t0 = tsr_now_seconds();
    CURLcode cr = curl_easy_perform(h);
    double t_end = tsr_now_seconds();
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (cr != CURLE_OK) {
        rc = tsr_error_set(err, TSR_ERR_IO, "POST %s: %s", full, curl_easy_strerror(cr));
        goto done;
    }
    if (code != 200) {
        rc = tsr_error_set(err, TSR_ERR_REFUSED, "POST %s: HTTP %ld: %.400s", full, code, s.raw.p ? s.raw.p : "");
        goto done;
    }
    if (s.failed) {
        rc = tsr_error_set(err, TSR_ERR_PLUGIN, "case '%s': %s", c->name, s.failure);
        goto done;
    }
    if (s.sse_rc != TSR_OK) {
        rc = tsr_error_set(err, s.sse_rc, "case '%s': %s", c->name, s.sse_err.msg);
        goto done;
    }
    if (!s.done || tsr_sse_pending(&s.sse)) {
        rc = tsr_error_set(err, TSR_ERR_FORMAT, "case '%s': the stream ended without [DONE]", c->name);
        goto done;
    }
    if (s.n_gen <= 0 || s.t_first == 0) {
        rc = tsr_error_set(err, TSR_ERR_FORMAT, "case '%s': no tokens or no usage in the stream", c->name);
        goto done;
    }
    out->n_prompt = s.n_prompt;
    out->n_gen = s.n_gen;
    out->ttft_s = s.t_first - s.t0;
    out->e2e_s = t_end - s.t0;
    out->prefill_tps = out->ttft_s > 0 ? s.n_prompt / out->ttft_s : 0;
    /* chunks may reach us in one burst: then the time after the first token */
    double dt = s.t_last - s.t_first;
    if (dt < 1e-4) dt = t_end - s.t_first;
    out->decode_tps = s.n_gen > 1 && dt > 0 ? (s.n_gen - 1) / dt : 0;
    *tokens = s.tokens;
    s.tokens = NULL;
    *text = s.text.p ? s.text.p : strdup("");
    s.text.p = NULL;
done:
    if (h) curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    free(body);
    json_decref(s.tokens);
    free(s.text.p);
    free(s.raw.p);
    tsr_sse_free(&s.sse);
    return rc;
}

/* ---- a whole workload ---- */

typedef struct prom_snap { double acc, passes, hits, misses; int ok; } prom_snap;

static prom_snap scrape(const char *url) {
    prom_snap p = {0};
    long code;
    char *body = NULL;
    tsr_error e;
    tsr_error_clear(&e);
    if (http_get(url, "/metrics", 30, &code, &body, &e) || code != 200) {
        free(body);
        return p;
    }
    p.ok = !tsr_prom_value(body, "tessera_draft_accepted_tokens_total", &p.acc) &&
           !tsr_prom_value(body, "tessera_draft_verify_passes_total", &p.passes);
    tsr_prom_value(body, "tessera_expert_cache_lookups_total{result=\"hit\"}", &p.hits);
    tsr_prom_value(body, "tessera_expert_cache_lookups_total{result=\"miss\"}", &p.misses);
    free(body);
    return p;
}

void tsr_bench_result_free(tsr_bench_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_cases; i++) {
        free(r->cases[i].samples);
        json_decref(r->cases[i].tokens);
        free(r->cases[i].text);
    }
    free(r->cases);
    r->cases = NULL;
    r->n_cases = 0;
}

/* A case's medians (min, max) from its samples; v: scratch of n_samples. */
static void case_stats(tsr_bench_case *bc, double *v) {
    const int n = bc->n_samples;
    for (int k = 0; k < n; k++) v[k] = bc->samples[k].decode_tps;
    bc->decode_tps = tsr_stat3_of(v, n);
    for (int k = 0; k < n; k++) v[k] = bc->samples[k].prefill_tps;
    bc->prefill_tps = tsr_stat3_of(v, n);
    for (int k = 0; k < n; k++) v[k] = bc->samples[k].ttft_s;
    bc->ttft_s = tsr_stat3_of(v, n);
    for (int k = 0; k < n; k++) v[k] = bc->samples[k].e2e_s;
    bc->e2e_s = tsr_stat3_of(v, n);
}

/* The mean of two rates, either of which may be unknown (< 0). */
static double mean_known(double a, double b) { return a < 0 ? b : b < 0 ? a : (a + b) / 2; }

int tsr_bench_merge(tsr_bench_result *into, tsr_bench_result *more, tsr_error *err) {
    int rc = TSR_OK;
    if (more->n_cases != into->n_cases)
        rc = tsr_error_set(err, TSR_ERR_INVALID, "merging %d cases into %d", more->n_cases, into->n_cases);
    for (int i = 0; i < into->n_cases && rc == TSR_OK; i++)
        if (strcmp(into->cases[i].name, more->cases[i].name))
            rc = tsr_error_set(err, TSR_ERR_INVALID, "merging case '%s' into '%s'", more->cases[i].name,
                               into->cases[i].name);
    for (int i = 0; i < into->n_cases && rc == TSR_OK; i++) {
        tsr_bench_case *a = &into->cases[i];
        const tsr_bench_case *b = &more->cases[i];
        const int n = a->n_samples + b->n_samples;
        tsr_bench_sample *s = realloc(a->samples, (size_t)(n > 0 ? n : 1) * sizeof *s);
        double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
        if (!s || !v) {
            if (s) a->samples = s;
            free(v);
            rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(s + a->n_samples, b->samples, (size_t)b->n_samples * sizeof *s);
        a->samples = s;
        a->n_samples = n;
        case_stats(a, v);
        free(v);
        a->draft_accept_per_pass = mean_known(a->draft_accept_per_pass, b->draft_accept_per_pass);
        a->expert_hit_rate = mean_known(a->expert_hit_rate, b->expert_hit_rate);
    }
    tsr_bench_result_free(more);
    return rc;
}

int tsr_bench_run(const tsr_bench_opts *o, tsr_bench_result *out, tsr_error *err) {
    memset(out, 0, sizeof *out);
    const tsr_workload *w = o->w;
    if (o->fig) out->fig = *o->fig;
    out->cases = calloc((size_t)w->n_cases, sizeof *out->cases);
    if (!out->cases) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    double *v = malloc(sizeof(double) * (size_t)w->repeats);
    if (!v) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    int rc = TSR_OK;
    for (int i = 0; i < w->n_cases && rc == TSR_OK; i++) {
        const tsr_wl_case *c = &w->cases[i];
        tsr_bench_case *bc = &out->cases[out->n_cases++];
        snprintf(bc->name, sizeof bc->name, "%s", c->name);
        snprintf(bc->kind, sizeof bc->kind, "%s", c->kind);
        if (!(bc->samples = calloc((size_t)w->repeats, sizeof *bc->samples))) {
            rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
            break;
        }
        /* The tokens come from the first warm-up run (one untimed run more
         * without warm-up), asked with logprobs: a server then copies every
         * token's logits to the host and normalises them on the CPU (with
         * the copy, ~1.8 ms a token more through the server than the
         * engine's passes at the Qwen3-8B shape on the H200, before the
         * normalisation was vectorised), so timed runs do not ask. Greedy:
         * every timed run must give the same text. */
        const int untimed = w->warmup > 0 ? w->warmup : 1;
        for (int r = 0; r < untimed && rc == TSR_OK; r++) {
            if (o->progress) o->progress(o->progress_ud, i, w->n_cases, c->name, -1, untimed);
            tsr_bench_sample s;
            json_t *tk;
            char *tx;
            rc = tsr_bench_request(o->url, c, o->request_timeout_s, r == 0, &s, &tk, &tx, err);
            if (r == 0 && rc == TSR_OK) {
                bc->tokens = tk;
                bc->text = tx;
            } else {
                json_decref(tk);
                free(tx);
            }
        }
        prom_snap p0 = scrape(o->url);
        for (int r = 0; r < w->repeats && rc == TSR_OK; r++) {
            if (o->progress) o->progress(o->progress_ud, i, w->n_cases, c->name, r, w->repeats);
            json_t *tk;
            char *tx;
            rc = tsr_bench_request(o->url, c, o->request_timeout_s, 0, &bc->samples[r], &tk, &tx, err);
            if (rc) break;
            bc->n_samples++;
            if (strcmp(tx, bc->text))
                rc = tsr_error_set(err, TSR_ERR_PLUGIN,
                                   "repetition %d's text differs from the first run's (greedy decoding of one "
                                   "prompt gave two texts: the engine is not deterministic)",
                                   r + 1);
            json_decref(tk);
            free(tx);
        }
        if (rc) {
            tsr_error_prefix(err, "case '%s'", c->name);
            break;
        }
        prom_snap p1 = scrape(o->url);
        case_stats(bc, v);
        bc->n_prompt = bc->samples[0].n_prompt;
        bc->n_gen = bc->samples[0].n_gen;
        tsr_bench_ceilings(o->fig, o->dev, bc->n_prompt, bc->n_gen, &bc->decode_ceiling_tps,
                           &bc->prefill_ceiling_tps);
        double dp = p1.passes - p0.passes;
        bc->draft_accept_per_pass = p0.ok && p1.ok && dp > 0 ? (p1.acc - p0.acc) / dp : -1;
        double lk = (p1.hits - p0.hits) + (p1.misses - p0.misses);
        bc->expert_hit_rate = lk > 0 ? (p1.hits - p0.hits) / lk : -1;
    }
    free(v);
    if (rc) tsr_bench_result_free(out);
    return rc;
}
