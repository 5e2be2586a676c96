/* http.c - libmicrohttpd front end (see server.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../util/checked.h"
#include "response.h"
#include "server.h"

enum { SRV_LOADING = 0, SRV_READY = 1, SRV_FAILED = 2 };

struct tsr_server {
    tsr_server_opts o;
    struct MHD_Daemon *d;
    int port;
    tsr_srv_metrics metrics;
    pthread_mutex_t mu;
    int state;
    char failure[512];
    tsr_srv_backend be;
    tsr_srv_sched *sched;
    atomic_int open_requests; /* requests between arrival and completion */
    char *engine_info;        /* GET /v1/engine body (tsr_server_set_engine_info), or NULL */
};

/* Per connection request. */
/* Bytes of connection memory kept beside max_header for a response: the
 * streaming block (4 KiB), chunk framing and response headers, with slack. */
enum { kResponseRoom = 16 << 10 };

typedef struct conn_ctx {
    int api;            /* a /v1 generation endpoint: counted in the metrics */
    int status;         /* status queued, 0 none */
    int too_large;
    int headers_too_large; /* request line + headers above max_header: 431 */
    tsr_srv_buf body;
} conn_ctx;

/* Bytes of the request's headers as sent ("Name: value\r\n" each). */
static enum MHD_Result add_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

/* A streaming response's reader state. */
typedef struct stream_ctx {
    tsr_server *s;
    tsr_srv_job *job;
    struct MHD_Connection *conn;
    tsr_srv_resp_info ri;
    int first;
    int finished;
    tsr_srv_buf out;
    size_t off;
} stream_ctx;

static int server_state(tsr_server *s) {
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    if (st == SRV_READY && s->sched && tsr_srv_sched_fatal(s->sched)) st = SRV_FAILED;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* The peer closed its end (or the socket failed). */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLIN) {
        char b;
        ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return 1;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    }
    return 0;
}

/* libmicrohttpd's messages, less the one every client abort causes. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (strstr(msg, "application error generating response")) return;
    fprintf(stderr, "tessera serve: %s", msg);
}

static enum MHD_Result reply(struct MHD_Connection *c, conn_ctx *cc, int status, const char *type,
                             char *body /* malloc'ed, taken */) {
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":null}}";
    struct MHD_Response *r;
    if (body)
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    else {
        status = 503;
        type = "application/json";
        r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    if (cc) cc->status = status;
    return ok;
}

static enum MHD_Result reply_error(tsr_server *s, struct MHD_Connection *c, conn_ctx *cc,
                                   const tsr_srv_error *e) {
    char *body = tsr_srv_error_json(e);
    if (e->status != 429 || !body) return reply(c, cc, e->status, "application/json", body);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    char ra[16];
    snprintf(ra, sizeof ra, "%d", s->o.retry_after_s);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    enum MHD_Result ok = MHD_queue_response(c, 429, r);
    MHD_destroy_response(r);
    if (cc) cc->status = 429;
    return ok;
}

static enum MHD_Result reply_errorf(tsr_server *s, struct MHD_Connection *c, conn_ctx *cc,
                                    int status, const char *msg) {
    tsr_srv_error e;
    tsr_srv_error_set(&e, status, "", "%s", msg);
    return reply_error(s, c, cc, &e);
}

static const char *finish_name(tsr_finish f) {
    return f == TSR_FINISH_LENGTH ? "length" : "stop";
}

/* Streaming: format what the job produced into st->out. */
static void stream_fill(stream_ctx *st, tsr_srv_take *t) {
    if (t->len || t->logprobs) {
        char *js = tsr_srv_chunk_json(&st->ri, st->first, t->text, t->len, t->logprobs,
                                      t->text_offset, NULL);
        tsr_srv_sse_append(&st->out, js);
        free(js);
        st->first = 0;
    }
    if (!t->done) return;
    if (t->status != 200 || t->finish == TSR_FINISH_CANCELLED || t->finish == TSR_FINISH_NONE) {
        tsr_srv_error e = t->error;
        if (t->status == 200) tsr_srv_error_set(&e, 503, "", "the request was cancelled");
        char *js = tsr_srv_error_json(&e);
        tsr_srv_sse_append(&st->out, js);
        free(js);
    } else {
        char *js = tsr_srv_chunk_json(&st->ri, st->first, "", 0, NULL, t->text_offset + t->len,
                                      finish_name(t->finish));
        tsr_srv_sse_append(&st->out, js);
        free(js);
        if (st->job->rq.include_usage) {
            js = tsr_srv_usage_chunk_json(&st->ri, t->n_prompt, t->n_generated);
            tsr_srv_sse_append(&st->out, js);
            free(js);
        }
        tsr_srv_buf_append(&st->out, "data: [DONE]\n\n", 14);
    }
    /* After an error event the stream just ends (no [DONE]), as OpenAI's does. */
    st->finished = 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *st = cls;
    (void)pos;
    while (st->off == st->out.len) {
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        st->off = st->out.len = 0;
        if (client_gone(st->conn)) {
            tsr_srv_job_cancel(st->s->sched, st->job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        tsr_srv_take t;
        if (tsr_srv_job_take(st->s->sched, st->job, 100, &t)) {
            stream_fill(st, &t);
            tsr_srv_take_clear(&t);
        }
    }
    size_t n = st->out.len - st->off;
    if (n > max) n = max;
    memcpy(buf, st->out.data + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream_ctx *st = cls;
    /* A stream that did not reach its end: the client went away. */
    tsr_srv_job_cancel(st->s->sched, st->job);
    tsr_srv_job_release(st->s->sched, st->job);
    tsr_srv_buf_free(&st->out);
    free(st);
}

static enum MHD_Result handle_generate(tsr_server *s, struct MHD_Connection *c, conn_ctx *cc,
                                       tsr_srv_kind kind) {
    tsr_srv_error e;
    memset(&e, 0, sizeof e);
    if (cc->too_large) {
        tsr_srv_error_set(&e, 413, "", "the request body is larger than %zu bytes", s->o.max_body);
        return reply_error(s, c, cc, &e);
    }
    tsr_srv_request rq;
    if (tsr_srv_request_parse(kind, cc->body.data, cc->body.len, &rq, &e))
        return reply_error(s, c, cc, &e);
    int st = server_state(s);
    if (st != SRV_READY) {
        tsr_srv_request_clear(&rq);
        return reply_errorf(s, c, cc, 503,
                            st == SRV_LOADING ? "the model is still loading" : "the engine failed");
    }
    tsr_srv_job *j = tsr_srv_submit(s->sched, &rq, &e);
    tsr_srv_request_clear(&rq);
    if (!j) return reply_error(s, c, cc, &e);

    while (tsr_srv_job_wait_started(s->sched, j, 100) == TSR_SRV_JOB_QUEUED) {
        if (client_gone(c)) {
            tsr_srv_job_cancel(s->sched, j);
            tsr_srv_job_release(s->sched, j);
            return MHD_NO;
        }
    }
    tsr_srv_resp_info ri = {kind, j->id, s->be.model_id, j->created};
    if (j->rq.stream) {
        tsr_srv_take t;
        /* Refused before it started (prompt too long, ...): a plain error. */
        if (tsr_srv_job_take(s->sched, j, 0, &t) && t.done && t.status != 200) {
            enum MHD_Result r = reply_error(s, c, cc, &t.error);
            tsr_srv_take_clear(&t);
            tsr_srv_job_release(s->sched, j);
            return r;
        }
        stream_ctx *sc = calloc(1, sizeof *sc);
        if (!sc) {
            tsr_srv_take_clear(&t);
            tsr_srv_job_cancel(s->sched, j);
            tsr_srv_job_release(s->sched, j);
            return reply_errorf(s, c, cc, 503, "out of memory");
        }
        sc->s = s;
        sc->job = j;
        sc->conn = c;
        sc->ri = ri;
        sc->first = 1;
        stream_fill(sc, &t);
        tsr_srv_take_clear(&t);
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, sc, stream_free);
        if (!r) {
            stream_free(sc);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        cc->status = 200;
        return ok;
    }

    /* Not streamed: wait for the end, watching the client. */
    tsr_srv_buf text = {0};
    json_t *lp = NULL;
    tsr_srv_take t;
    for (;;) {
        int got = tsr_srv_job_take(s->sched, j, 100, &t);
        /* Checked every time: output may arrive faster than the timeout. */
        if (!(got && t.done) && client_gone(c)) {
            tsr_srv_take_clear(&t);
            tsr_srv_job_cancel(s->sched, j);
            tsr_srv_job_release(s->sched, j);
            tsr_srv_buf_free(&text);
            json_decref(lp);
            return MHD_NO;
        }
        if (!got) continue;
        if (t.len) tsr_srv_buf_append(&text, t.text, t.len);
        if (t.logprobs) {
            if (!lp) lp = json_array();
            if (lp) json_array_extend(lp, t.logprobs);
        }
        if (t.done) break;
        tsr_srv_take_clear(&t);
    }
    enum MHD_Result r;
    if (t.status != 200 || t.finish == TSR_FINISH_CANCELLED || t.finish == TSR_FINISH_NONE) {
        tsr_srv_error e2 = t.error;
        if (t.status == 200) tsr_srv_error_set(&e2, 503, "", "the request was cancelled");
        r = reply_error(s, c, cc, &e2);
    } else {
        if (j->rq.logprobs && !lp) lp = json_array(); /* asked for, even if empty */
        char *body = tsr_srv_response_json(&ri, text.data ? text.data : "", text.len,
                                           j->rq.logprobs ? lp : NULL,
                                           finish_name(t.finish), t.n_prompt, t.n_generated);
        r = reply(c, cc, 200, "application/json", body);
    }
    tsr_srv_take_clear(&t);
    tsr_srv_buf_free(&text);
    json_decref(lp);
    tsr_srv_job_release(s->sched, j);
    return r;
}

static enum MHD_Result handle_get(tsr_server *s, struct MHD_Connection *c, conn_ctx *cc,
                                  const char *url) {
    if (!strcmp(url, "/health")) {
        int st = server_state(s);
        json_t *j;
        if (st == SRV_READY) j = json_pack("{s:s}", "status", "ok");
        else if (st == SRV_LOADING) j = json_pack("{s:s}", "status", "loading");
        else {
            pthread_mutex_lock(&s->mu);
            j = json_pack("{s:s, s:s}", "status", "error", "message",
                          s->failure[0] ? s->failure : "the engine failed");
            pthread_mutex_unlock(&s->mu);
        }
        char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        return reply(c, cc, st == SRV_READY ? 200 : 503, "application/json", body);
    }
    if (!strcmp(url, "/metrics")) {
        char *body = tsr_srv_metrics_render(&s->metrics);
        return reply(c, cc, 200, "text/plain; version=0.0.4; charset=utf-8", body);
    }
    if (!strcmp(url, "/v1/models")) {
        if (server_state(s) != SRV_READY)
            return reply_errorf(s, c, cc, 503, "the model is still loading");
        json_t *j = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id",
                              s->be.model_id, "object", "model", "created",
                              (json_int_t)time(NULL), "owned_by", "tessera");
        char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        return reply(c, cc, 200, "application/json", body);
    }
    if (!strcmp(url, "/v1/engine")) {
        pthread_mutex_lock(&s->mu);
        char *body = s->engine_info ? strdup(s->engine_info) : NULL;
        pthread_mutex_unlock(&s->mu);
        if (!body) return reply_errorf(s, c, cc, 404, "no engine description (yet)");
        return reply(c, cc, 200, "application/json", body);
    }
    return reply_errorf(s, c, cc, 404, "no such endpoint");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    tsr_server *s = cls;
    conn_ctx *cc = *con_cls;
    int is_chat = !strcmp(url, "/v1/chat/completions");
    int is_cmpl = !strcmp(url, "/v1/completions");
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        cc->api = is_chat || is_cmpl;
        *con_cls = cc;
        atomic_fetch_add(&s->open_requests, 1);
        size_t head = strlen(method) + strlen(url) + strlen(version) + 4;
        MHD_get_connection_values(c, MHD_HEADER_KIND, add_header_bytes, &head);
        cc->headers_too_large = head > s->o.max_header;
        if (cc->api && !strcmp(method, "POST")) {
            const char *cl =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl) {
                char *end;
                errno = 0;
                unsigned long long v = strtoull(cl, &end, 10);
                if (errno || *end || v > s->o.max_body) cc->too_large = 1;
            }
        }
        return MHD_YES;
    }
    if (*upload_size) { /* bodies are kept for POST to the API only; others are dropped */
        if (!cc->too_large && cc->api && !strcmp(method, "POST")) {
            uint64_t total;
            if (tsr_add_u64(cc->body.len, *upload_size, &total) || total > s->o.max_body) {
                cc->too_large = 1;
                tsr_srv_buf_free(&cc->body);
            } else if (tsr_srv_buf_append(&cc->body, upload_data, *upload_size)) {
                cc->too_large = 1;
                tsr_srv_buf_free(&cc->body);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->headers_too_large) {
        char msg[96];
        snprintf(msg, sizeof msg, "request line and headers exceed %zu bytes", s->o.max_header);
        return reply_errorf(s, c, cc, 431, msg);
    }
    if (is_chat || is_cmpl) {
        if (strcmp(method, "POST") != 0) return reply_errorf(s, c, cc, 405, "use POST");
        return handle_generate(s, c, cc, is_chat ? TSR_SRV_CHAT : TSR_SRV_COMPLETION);
    }
    if (!strcmp(method, "GET") || !strcmp(method, "HEAD")) return handle_get(s, c, cc, url);
    return reply_errorf(s, c, cc, 405, "method not allowed");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    tsr_server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    /* 499: the client went away before any response (nginx's convention). */
    if (cc->api) tsr_srv_metrics_request(&s->metrics, cc->status ? cc->status : 499);
    tsr_srv_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
    atomic_fetch_sub(&s->open_requests, 1);
}

int tsr_server_start(const tsr_server_opts *o, tsr_server **out, tsr_error *err) {
    *out = NULL;
    tsr_server *s = calloc(1, sizeof *s);
    if (!s) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    s->o = *o;
    if (!s->o.host) s->o.host = "127.0.0.1";
    if (!s->o.max_body) s->o.max_body = 1 << 20;
    if (!s->o.max_header) s->o.max_header = 32 << 10;
    if (!s->o.max_connections) s->o.max_connections = 512;
    if (!s->o.retry_after_s) s->o.retry_after_s = 1;
    if (s->o.parallel < 1 || s->o.queue < 0 || s->o.port < 0 || s->o.port > 65535) {
        free(s);
        return tsr_error_set(err, TSR_ERR_INVALID,
                             "bad server options: parallel >= 1, queue >= 0, port 0..65535");
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->o.port);
    if (inet_pton(AF_INET, s->o.host, &addr.sin_addr) != 1) {
        free(s);
        return tsr_error_set(err, TSR_ERR_INVALID, "--host '%s' is not an IPv4 address", o->host);
    }
    tsr_srv_metrics_init(&s->metrics);
    pthread_mutex_init(&s->mu, NULL);
    /* A connection's memory holds its request line and headers (on_request
     * answers 431 above max_header; libmicrohttpd itself when they do not fit
     * at all), the body as it streams through, and a streaming response's
     * buffers: max_header alone left a stream of 4 KiB blocks without room
     * when a request's body was still buffered (libmicrohttpd then closed the
     * stream mid-way), hence the room for the response beside it. */
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                MHD_USE_ITC | MHD_USE_ERROR_LOG,
                            (uint16_t)s->o.port, NULL, NULL, on_request, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                            NULL, MHD_OPTION_SOCK_ADDR, &addr,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->o.max_header + kResponseRoom,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    if (!s->d) {
        int e = errno;
        pthread_mutex_destroy(&s->mu);
        tsr_srv_metrics_destroy(&s->metrics);
        free(s);
        return tsr_error_set(err, TSR_ERR_IO, "cannot listen on %s:%d: %s", o->host ? o->host : "127.0.0.1",
                             o->port, e ? strerror(e) : "libmicrohttpd failed to start");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->o.port;
    *out = s;
    return TSR_OK;
}

int tsr_server_port(const tsr_server *s) {
    return s->port;
}

int tsr_server_set_backend(tsr_server *s, const tsr_srv_backend *be, tsr_error *err) {
    tsr_srv_sched_opts so = {s->o.parallel, s->o.queue};
    tsr_srv_sched *sched;
    s->be = *be;
    int rc = tsr_srv_sched_new(&s->be, &so, &s->metrics, &sched, err);
    if (rc) return rc;
    pthread_mutex_lock(&s->mu);
    s->sched = sched;
    s->state = SRV_READY;
    pthread_mutex_unlock(&s->mu);
    return TSR_OK;
}

void tsr_server_set_failed(tsr_server *s, const char *why) {
    pthread_mutex_lock(&s->mu);
    s->state = SRV_FAILED;
    snprintf(s->failure, sizeof s->failure, "%s", why ? why : "loading failed");
    pthread_mutex_unlock(&s->mu);
}

int tsr_server_set_engine_info(tsr_server *s, const char *json) {
    char *copy = json ? strdup(json) : NULL;
    if (json && !copy) return TSR_ERR_NOMEM;
    pthread_mutex_lock(&s->mu);
    free(s->engine_info);
    s->engine_info = copy;
    pthread_mutex_unlock(&s->mu);
    return TSR_OK;
}

int tsr_server_fatal(tsr_server *s) {
    return s->sched && tsr_srv_sched_fatal(s->sched);
}

int tsr_server_shutdown(tsr_server *s, double timeout_s) {
    if (!s || !s->d) return 0;
    MHD_socket lfd = MHD_quiesce_daemon(s->d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    int cancelled = 0;
    if (s->sched) {
        tsr_srv_sched_stop_accepting(s->sched);
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            if (tsr_srv_sched_active(s->sched) == 0) break;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 >= timeout_s) {
                cancelled = tsr_srv_sched_active(s->sched);
                tsr_srv_sched_cancel_all(s->sched);
                break;
            }
            usleep(20000);
        }
        for (int i = 0; i < 500 && tsr_srv_sched_active(s->sched) > 0; i++) usleep(10000);
    }
    /* Let the last chunks of every stream reach their clients. */
    for (int i = 0; i < 300 && atomic_load(&s->open_requests) > 0; i++) usleep(10000);
    /* Joins the connection threads: every stream has reached its end. */
    MHD_stop_daemon(s->d);
    s->d = NULL;
    return cancelled;
}

void tsr_server_free(tsr_server *s) {
    if (!s) return;
    if (s->d) tsr_server_shutdown(s, 0);
    tsr_srv_sched_free(s->sched);
    pthread_mutex_destroy(&s->mu);
    tsr_srv_metrics_destroy(&s->metrics);
    free(s->engine_info);
    free(s);
}

tsr_srv_metrics *tsr_server_metrics(tsr_server *s) {
    return &s->metrics;
}
