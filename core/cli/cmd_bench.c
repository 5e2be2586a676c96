/* tessera bench: an engine measured through its HTTP API against its ceilings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../ablation/bench.h"
#include "commands.h"
#include "model_opts.h"

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: tessera bench [ASSEMBLY] [--model PATH] [--workload FILE] [--url URL]\n"
            "                     [--device device.json] [--chat-format F] [--catalog DIR]\n"
            "                     [--threads N] [--ctx N]\n\n"
            "Starts `tessera serve` on a free loopback port (or uses --url), runs each case of the\n"
            "workload (warm-up, then the median of repetitions, with min and max) streaming, and\n"
            "prints decode tok/s, prefill tok/s, TTFT and end-to-end time next to the ceilings of\n"
            "this machine (from --device or measured now) and the fraction reached.\n\n"
            "  --workload FILE    default: ablation/workloads/ci.json\n"
            "  --url URL          a running server (its /v1/engine, if any, gives the ceilings)\n"
            "  --device FILE      a `tessera probe` record (default: probe now)\n"
            "  --chat-format F    passed to tessera serve (default: chatml for the embedded model)\n");
}

static void pct(double x, double ceil) {
    if (ceil > 0) printf(" %9.1f %5.1f%%", ceil, 100 * x / ceil);
    else printf(" %9s %6s", "n/a", "");
}

int tsr_cmd_bench(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        bench_usage(stdout);
        return 0;
    }
    tsr_model_opts mo = {0};
    const char *url = NULL, *device = NULL, *chat = NULL;
    static char wl[1200];
    snprintf(wl, sizeof wl, "%s/ablation/workloads/ci.json", tsr_cli_source_dir());
    const char *workload = wl;
    for (int i = 1; i < argc; i++) {
        int r = tsr_cli_model_opt(argc, argv, &i, &mo, "bench");
        if (r < 0) return 2;
        if (r > 0) continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera bench: unknown option or missing value: %s\n", argv[i]);
            bench_usage(stderr);
            return 2;
        }
        const char *a = argv[i], *v = argv[++i];
        if (!strcmp(a, "--workload")) workload = v;
        else if (!strcmp(a, "--url")) url = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--chat-format")) chat = v;
        else {
            fprintf(stderr, "tessera bench: unknown option %s\n", a);
            bench_usage(stderr);
            return 2;
        }
    }
    tsr_error err;
    tsr_error_clear(&err);
    char msg[2048];
    tsr_workload *w = NULL;
    if (tsr_workload_load(workload, &w, &err) != TSR_OK) {
        fprintf(stderr, "tessera bench: %s\n", tsr_error_format(&err, msg, sizeof msg));
        return 2;
    }
    tsr_probe_result dev;
    int rc;
    if (device) {
        json_error_t je;
        json_t *j = json_load_file(device, 0, &je);
        rc = j ? tsr_probe_from_json(j, &dev, &err)
               : tsr_error_set_at(&err, TSR_ERR_FORMAT, device, je.line, je.column, "%s", je.text);
        json_decref(j);
    } else {
        tsr_probe_opts po = {.n_threads = mo.n_threads};
        rc = tsr_probe_run(&po, &dev, &err);
    }
    if (rc != TSR_OK) {
        fprintf(stderr, "tessera bench: %s\n", tsr_error_format(&err, msg, sizeof msg));
        tsr_workload_free(w);
        return 2;
    }
    if (!chat && !mo.model_path && !url) chat = "chatml"; /* stories260K has no template */
    char logp[] = "/tmp/tessera-bench-XXXXXX";
    int lfd = -1;
    tsr_served sv = {0};
    tsr_serve_spec spec = {.exe = getenv("TESSERA_BIN"), /* NULL: /proc/self/exe */
                           .assembly = mo.assembly_path, .model = mo.model_path, .catalog = mo.catalog_dir,
                           .chat_format = chat, .n_threads = mo.n_threads, .ctx = mo.max_ctx};
    if (!url) {
        if ((lfd = mkstemp(logp)) < 0) {
            fprintf(stderr, "tessera bench: cannot create a log file in /tmp\n");
            tsr_workload_free(w);
            return 1;
        }
        close(lfd);
        spec.log_path = logp;
        fprintf(stderr, "tessera bench: starting tessera serve (log %s)\n", logp);
        if (tsr_serve_spawn(&spec, &sv, &err) != TSR_OK) {
            fprintf(stderr, "tessera bench: %s\n", tsr_error_format(&err, msg, sizeof msg));
            tsr_workload_free(w);
            return 2;
        }
        url = sv.url;
    }
    tsr_engine_figures fig;
    rc = tsr_engine_figures_http(url, &fig, &err);
    if (rc == TSR_OK && !fig.known && sv.pid) rc = tsr_engine_figures_local(&spec, &fig, &err);
    if (rc != TSR_OK) fprintf(stderr, "tessera bench: no ceilings: %s\n", tsr_error_format(&err, msg, sizeof msg));
    else if (!fig.known)
        fprintf(stderr, "tessera bench: no ceilings: the server does not answer GET /v1/engine\n");
    tsr_error_clear(&err);
    tsr_bench_result br;
    tsr_bench_opts bo = {.url = url, .w = w, .dev = &dev, .fig = &fig};
    rc = tsr_bench_run(&bo, &br, &err);
    if (sv.pid && tsr_serve_stop(&sv) == 0) unlink(logp); /* kept when serve failed */
    if (rc != TSR_OK) {
        fprintf(stderr, "tessera bench: %s\n", tsr_error_format(&err, msg, sizeof msg));
        tsr_workload_free(w);
        return 1;
    }
    printf("engine %s; read %.2f GB/s, sgemm %.1f GFLOP/s; workload %s v%d (median of %d)\n",
           fig.known ? fig.assembly : "?", dev.read_gbs, dev.gemm_gflops, w->name, w->version, w->repeats);
    printf("%-18s %5s %5s %9s %9s %9s   %9s %6s %9s %9s %6s %9s %9s %6s\n", "case", "in", "out", "decode/s",
           "min", "max", "ceiling", "share", "prefill/s", "ceiling", "share", "ttft ms", "e2e ms", "accept");
    for (int i = 0; i < br.n_cases; i++) {
        const tsr_bench_case *c = &br.cases[i];
        printf("%-18.18s %5d %5d %9.1f %9.1f %9.1f", c->name, c->n_prompt, c->n_gen, c->decode_tps.med,
               c->decode_tps.min, c->decode_tps.max);
        printf("  ");
        pct(c->decode_tps.med, c->decode_ceiling_tps);
        printf(" %9.1f", c->prefill_tps.med);
        pct(c->prefill_tps.med, c->prefill_ceiling_tps);
        printf(" %9.2f %9.2f", c->ttft_s.med * 1e3, c->e2e_s.med * 1e3);
        if (c->draft_accept_per_pass >= 0) printf(" %6.2f", c->draft_accept_per_pass);
        else printf(" %6s", "-");
        if (c->expert_hit_rate >= 0) printf(" experts hit %.1f%%", 100 * c->expert_hit_rate);
        printf("\n");
    }
    tsr_bench_result_free(&br);
    tsr_workload_free(w);
    return 0;
}
