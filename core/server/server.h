/*
 * server.h - tessera's OpenAI-compatible HTTP server (libmicrohttpd, one
 * thread per connection) in front of the scheduler (sched.h).
 *
 * Endpoints: POST /v1/chat/completions and /v1/completions (stream false or
 * true: server-sent events), GET /v1/models, GET /health, GET /metrics.
 * docs/SERVER.md describes them, the fields, validation, metrics and
 * scheduling.
 *
 * Life cycle: tsr_server_start listens at once and answers /health with 503
 * ("loading") until tsr_server_set_backend hands it a loaded engine (or
 * tsr_server_set_failed says loading failed). tsr_server_shutdown stops
 * accepting, lets running requests finish up to a timeout, cancels the rest,
 * and closes every connection.
 */
#ifndef TSR_SRV_SERVER_H
#define TSR_SRV_SERVER_H

#include <stddef.h>

#include "../util/error.h"
#include "metrics.h"
#include "sched.h"

typedef struct tsr_server_opts {
    const char *host;      /* NULL: 127.0.0.1 */
    int port;              /* 0: any free port (see tsr_server_port) */
    int parallel;          /* requests generating together (>= 1) */
    int queue;             /* waiting requests before 429 (>= 0) */
    size_t max_body;       /* bytes of request body (413 beyond); 0: 1 MiB */
    size_t max_header;     /* bytes of request line + headers (431 beyond); 0: 32 KiB */
    int max_connections;   /* 0: 512 */
    int retry_after_s;     /* Retry-After of a 429; 0: 1 */
} tsr_server_opts;

typedef struct tsr_server tsr_server;

int tsr_server_start(const tsr_server_opts *o, tsr_server **out, tsr_error *err);
/* The port it listens on. */
int tsr_server_port(const tsr_server *s);
/* Ready: start the scheduler on this engine (borrowed until free). */
int tsr_server_set_backend(tsr_server *s, const tsr_srv_backend *be, tsr_error *err);
/* Loading failed: /health answers 503 with why. */
void tsr_server_set_failed(tsr_server *s, const char *why);
/* The body of GET /v1/engine (JSON, copied; NULL: 404): what the engine
 * reads and computes per token, for `tessera bench` (ablation/bench.h). */
int tsr_server_set_engine_info(tsr_server *s, const char *json);
/* 1 after a fatal engine error (device error): the process should exit
 * non-zero. */
int tsr_server_fatal(tsr_server *s);
/* Stop accepting; wait up to timeout_s for running and queued requests to
 * finish, then cancel what is left. Returns the number cancelled. */
int tsr_server_shutdown(tsr_server *s, double timeout_s);
void tsr_server_free(tsr_server *s);

tsr_srv_metrics *tsr_server_metrics(tsr_server *s);

#endif /* TSR_SRV_SERVER_H */
