/* tessera serve: an OpenAI-compatible HTTP server for an assembled engine. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../ablation/bench.h"
#include "../server/backend_runtime.h"
#include "../server/server.h"
#include "commands.h"
#include "model_opts.h"

/* SIGTERM or SIGINT when it reached a thread that does not block them:
 * threads a library started before main (OpenBLAS starts its pool when it
 * is loaded) never saw the mask below, and without a handler the default
 * action there ended the process with status 143 (seen in CI: "SIGTERM on
 * an idle server"). */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) { g_stop_signal = sig; }

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: tessera serve [ASSEMBLY] [--model PATH] [--host ADDR] [--port N]\n"
            "                     [--parallel N] [--queue N] [--shutdown-timeout S]\n"
            "                     [--chat-format chatml|llama3|llama2] [--served-name NAME]\n"
            "                     [--max-body BYTES]\n\n"
            "Serves the engine that `tessera check ASSEMBLY` prints over an OpenAI-compatible API:\n"
            "POST /v1/chat/completions, POST /v1/completions (stream or not), GET /v1/models,\n"
            "GET /health (503 while loading or after an engine failure), GET /metrics\n"
            "(Prometheus). See docs/SERVER.md.\n\n"
            "%s"
            "  --host ADDR        IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port N           port (default 8000; 0: any free port, printed at start-up)\n"
            "  --parallel N       requests generating together, interleaved step by step\n"
            "                     (default 4)\n"
            "  --queue N          requests waiting beyond those; more get 429 (default 64)\n"
            "  --shutdown-timeout S  on SIGTERM/SIGINT, seconds to let running requests finish\n"
            "                     before cancelling them (default 30)\n"
            "  --chat-format F    chat template for /v1/chat/completions when the model has\n"
            "                     none (or to override it)\n"
            "  --served-name NAME model id in responses and /v1/models (default: the model\n"
            "                     file's name)\n"
            "  --max-body BYTES   largest request body (default 1048576; 413 beyond)\n",
            TSR_MODEL_OPTS_HELP);
}

static const char *base_name(const char *p) {
    if (!p) return "stories260K";
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    static char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)n, p);
    char *slash = strrchr(buf, '/');
    return slash && slash[1] ? slash + 1 : buf;
}

int tsr_cmd_serve(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        serve_usage(stdout);
        return 0;
    }
    tsr_model_opts mo = {.progress = 1};
    tsr_server_opts so = {.host = "127.0.0.1", .port = 8000, .parallel = 4, .queue = 64};
    double shutdown_timeout = 30;
    const char *chat_format = NULL, *served = NULL;
    for (int i = 1; i < argc; i++) {
        int r = tsr_cli_model_opt(argc, argv, &i, &mo, "serve");
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera serve: unknown option or missing value: %s\n", a);
            serve_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        long n;
        double d;
        if (!strcmp(a, "--host")) so.host = v;
        else if (!strcmp(a, "--port")) {
            if (tsr_cli_parse_int("serve", a, v, 0, 65535, &n)) return 2;
            so.port = (int)n;
        } else if (!strcmp(a, "--parallel")) {
            if (tsr_cli_parse_int("serve", a, v, 1, 1024, &n)) return 2;
            so.parallel = (int)n;
        } else if (!strcmp(a, "--queue")) {
            if (tsr_cli_parse_int("serve", a, v, 0, 1 << 20, &n)) return 2;
            so.queue = (int)n;
        } else if (!strcmp(a, "--max-body")) {
            if (tsr_cli_parse_int("serve", a, v, 1024, 1L << 30, &n)) return 2;
            so.max_body = (size_t)n;
        } else if (!strcmp(a, "--shutdown-timeout")) {
            if (tsr_cli_parse_float("serve", a, v, 0, 86400, &d)) return 2;
            shutdown_timeout = d;
        } else if (!strcmp(a, "--chat-format")) {
            if (tsr_chat_format_from_name(v) <= 0) {
                fprintf(stderr, "tessera serve: unknown --chat-format '%s' (chatml, llama3, llama2)\n", v);
                return 2;
            }
            chat_format = v;
        } else if (!strcmp(a, "--served-name")) served = v;
        else {
            fprintf(stderr, "tessera serve: unknown option %s\n", a);
            serve_usage(stderr);
            return 2;
        }
    }
    /* Signals are taken by sigtimedwait below; blocked before the server's
     * threads start so that none of them receives them, and caught by
     * on_stop_signal in the threads that started earlier. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    tsr_error err;
    tsr_error_clear(&err);
    char msg[2048];
    tsr_server *srv;
    if (tsr_server_start(&so, &srv, &err) != TSR_OK) {
        fprintf(stderr, "tessera serve: %s\n", tsr_error_format(&err, msg, sizeof msg));
        return err.code == TSR_ERR_INVALID ? 2 : 1;
    }
    fprintf(stderr, "tessera serve: listening on http://%s:%d (loading the model)\n", so.host,
            tsr_server_port(srv));

    tsr_model *m = NULL;
    if (tsr_model_load(&mo, &m, &err) != TSR_OK) {
        tsr_error_format(&err, msg, sizeof msg);
        tsr_server_set_failed(srv, msg);
        fprintf(stderr, "tessera serve: %s\n", msg);
        tsr_server_free(srv);
        return err.code == TSR_ERR_NOMEM || err.code == TSR_ERR_IO ? 1 : 2;
    }
    tsr_engine *eng = tsr_model_get_engine(m);
    fprintf(stderr, "tessera serve: engine '%s', context %d tokens, loaded in %.2f s:\n",
            tsr_engine_name(eng), tsr_model_ctx(m), tsr_model_load_seconds(m));
    tsr_engine_describe(eng, stderr);

    char *info = tsr_engine_info_json(m, &err); /* GET /v1/engine, for tessera bench */
    if (!info || tsr_server_set_engine_info(srv, info) != TSR_OK)
        fprintf(stderr, "tessera serve: no /v1/engine: %s\n", tsr_error_format(&err, msg, sizeof msg));
    free(info);
    tsr_error_clear(&err);

    tsr_srv_runtime rt;
    tsr_srv_backend be;
    int status = 0;
    if (tsr_srv_runtime_init(&rt, m, chat_format, served ? served : base_name(mo.model_path), &be,
                             &err) != TSR_OK ||
        tsr_server_set_backend(srv, &be, &err) != TSR_OK) {
        fprintf(stderr, "tessera serve: %s\n", tsr_error_format(&err, msg, sizeof msg));
        tsr_server_free(srv);
        tsr_model_free(m);
        return 2;
    }
    if (!rt.has_chat) fprintf(stderr, "tessera serve: chat disabled: %s\n", rt.chat_problem);
    fprintf(stderr, "tessera serve: ready on http://%s:%d, model '%s', parallel %d, queue %d\n",
            so.host, tsr_server_port(srv), rt.model_id, so.parallel, so.queue);
    fflush(stderr);

    for (;;) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        int sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig != SIGTERM && sig != SIGINT) sig = g_stop_signal;
        if (sig == SIGTERM || sig == SIGINT) {
            fprintf(stderr, "tessera serve: %s: finishing in-flight requests (up to %g s)\n",
                    sig == SIGTERM ? "SIGTERM" : "SIGINT", shutdown_timeout);
            int cancelled = tsr_server_shutdown(srv, shutdown_timeout);
            if (cancelled)
                fprintf(stderr, "tessera serve: cancelled %d requests at the timeout\n", cancelled);
            break;
        }
        if (tsr_server_fatal(srv)) {
            fprintf(stderr, "tessera serve: the engine failed; exiting\n");
            tsr_server_shutdown(srv, 0);
            status = 1;
            break;
        }
    }
    tsr_server_free(srv);
    tsr_model_free(m);
    fprintf(stderr, "tessera serve: stopped\n");
    return status;
}
