/* tessera ablate: each plugin's share of an assembly's speedup. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ablation/ablate.h"
#include "commands.h"
#include "model_opts.h"

static void ablate_usage(FILE *f) {
    fprintf(f,
            "usage: tessera ablate ASSEMBLY [--model PATH] [--workload FILE] [--out DIR]\n"
            "                      [--catalog DIR] [--threads N] [--ctx N] [--device device.json]\n"
            "                      [--chat-format F] [--probe-mib N] [--rounds N] [--resume] [--no-kl]\n"
            "                      [--quiet]\n\n"
            "Re-serves the engine once per variant (full; all-baseline; each non-baseline plugin\n"
            "off and alone; every subset when there are at most 5 of them, for exact Shapley\n"
            "values), measures each with the workload through the HTTP API, checks quality\n"
            "against the all-baseline variant, and writes DIR/result.json, result.csv, report.md\n"
            "and speedup.svg. See docs/ABLATION.md.\n\n"
            "  --workload FILE    default: ablation/workloads/ci.json\n"
            "  --out DIR          default: ablation-out\n"
            "  --device FILE      a `tessera probe` record (default: probe now)\n"
            "  --chat-format F    passed to tessera serve (default: chatml for the embedded model)\n"
            "  --probe-mib N      probe's read buffer when probing now\n"
            "  --rounds N         measure every variant N times (1-20, default 1), reversing the order\n"
            "                     every other round, and pool the samples: steadier on a noisy machine\n"
            "  --resume           continue an interrupted run in --out DIR (its result.json, written\n"
            "                     after every variant): the variants it measured are kept, with its\n"
            "                     device record; refused if the assembly, model, workload, rounds or\n"
            "                     git commit differ\n"
            "  --no-kl            do not score lossy variants (mean KL, perplexity ratio: each loads\n"
            "                     the model in this process again); exact ones are still compared\n"
            "                     token for token. For speed on random-weight checkpoints\n"
            "  --quiet            no progress bar\n");
}

int tsr_cmd_ablate(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        ablate_usage(stdout);
        return 0;
    }
    tsr_model_opts mo = {0};
    tsr_ablate_opts o = {.out_dir = "ablation-out", .progress = 1};
    static char wl[1200];
    snprintf(wl, sizeof wl, "%s/ablation/workloads/ci.json", tsr_cli_source_dir());
    o.workload = wl;
    for (int i = 1; i < argc; i++) {
        int r = tsr_cli_model_opt(argc, argv, &i, &mo, "ablate");
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--quiet")) {
            o.progress = 0;
            continue;
        }
        if (!strcmp(a, "--resume")) {
            o.resume = 1;
            continue;
        }
        if (!strcmp(a, "--no-kl")) {
            o.no_kl = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera ablate: unknown option or missing value: %s\n", a);
            ablate_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        long n;
        if (!strcmp(a, "--workload")) o.workload = v;
        else if (!strcmp(a, "--out")) o.out_dir = v;
        else if (!strcmp(a, "--device")) o.device_json = v;
        else if (!strcmp(a, "--chat-format")) o.chat_format = v;
        else if (!strcmp(a, "--rounds")) {
            if (tsr_cli_parse_int("ablate", a, v, 1, 20, &n)) return 2;
            o.rounds = (int)n;
        } else if (!strcmp(a, "--probe-mib")) {
            if (tsr_cli_parse_int("ablate", a, v, 1, 1 << 20, &n)) return 2;
            o.probe.buffer_bytes = (size_t)n << 20;
        } else {
            fprintf(stderr, "tessera ablate: unknown option %s\n", a);
            ablate_usage(stderr);
            return 2;
        }
    }
    if (!mo.assembly_path) {
        fprintf(stderr, "tessera ablate: an ASSEMBLY is required\n");
        ablate_usage(stderr);
        return 2;
    }
    if (mo.tokenizer_path) {
        fprintf(stderr, "tessera ablate: --tokenizer is not supported (serve finds it from the model)\n");
        return 2;
    }
    o.assembly = mo.assembly_path;
    o.model = mo.model_path;
    o.catalog = mo.catalog_dir;
    o.n_threads = mo.n_threads;
    o.ctx = mo.max_ctx;
    o.probe.n_threads = mo.n_threads;
    o.source_dir = tsr_cli_source_dir();
    o.exe = getenv("TESSERA_BIN"); /* NULL: /proc/self/exe (set it when running under valgrind) */
    if (!o.chat_format && !o.model) o.chat_format = "chatml"; /* stories260K has no template */
    tsr_abl_result *r = NULL;
    tsr_error err;
    tsr_error_clear(&err);
    char msg[2048];
    int rc = tsr_ablate_run(&o, &r, &err);
    if (rc != TSR_OK) {
        fprintf(stderr, "tessera ablate: %s\n", tsr_error_format(&err, msg, sizeof msg));
        return rc == TSR_ERR_NOMEM ? 1 : 2; /* bad input, refused assembly, unwritable output */
    }
    int refused = 0, failed = 0, bad_quality = 0;
    for (int i = 0; i < r->n_variants; i++) {
        refused += r->variants[i].refused;
        failed += r->variants[i].failed;
        bad_quality += !r->variants[i].refused && !r->variants[i].failed && !r->variants[i].quality_ok;
    }
    fprintf(stderr, "tessera ablate: %d variants (%d refused, %d failed, %d failing quality); %s; wrote %s/{result.json,result.csv,report.md,speedup.svg}\n",
            r->n_variants, refused, failed, bad_quality, r->shapley_note, o.out_dir);
    tsr_abl_result_free(r);
    return failed || bad_quality ? 1 : 0;
}
