/* tessera probe: this machine's ceilings (read bandwidth, GEMM rate). */
#include <stdio.h>
#include <string.h>

#include "../../ablation/probe.h"
#include "commands.h"
#include "model_opts.h"

static void probe_usage(FILE *f) {
    fprintf(f, "usage: tessera probe [--out device.json] [--threads N] [--buffer-mib N] [--repeats N]\n"
               "                     [--gemm-n N]\n\n"
               "Measures memory read bandwidth (a streaming read of a buffer far larger than the\n"
               "last-level cache, median of repeats), the OpenBLAS sgemm rate and the f32\n"
               "multiply-add peak (AVX2 + FMA in registers), and records the machine. With a\n"
               "CUDA device (and a CUDA build): its read bandwidth and cuBLASLt\n"
               "bf16 and fp8 matmul rates; otherwise the GPU fields are null with a note.\n\n"
               "  --out FILE         write the record (JSON) there; default: standard output\n"
               "  --threads N        reading, sgemm and FMA threads (default: every core)\n"
               "  --buffer-mib N     read buffer (default: 8 x the last-level cache, >= 256)\n"
               "  --repeats N        timed repetitions (default 5)\n"
               "  --gemm-n N         square sgemm size (default 1024)\n");
}

int tsr_cmd_probe(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        probe_usage(stdout);
        return 0;
    }
    tsr_probe_opts po = {0};
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera probe: unknown option or missing value: %s\n", argv[i]);
            probe_usage(stderr);
            return 2;
        }
        const char *a = argv[i], *v = argv[++i];
        long n;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--threads")) {
            if (tsr_cli_parse_int("probe", a, v, 1, 256, &n)) return 2;
            po.n_threads = (int)n;
        } else if (!strcmp(a, "--buffer-mib")) {
            if (tsr_cli_parse_int("probe", a, v, 1, 1 << 20, &n)) return 2;
            po.buffer_bytes = (size_t)n << 20;
        } else if (!strcmp(a, "--repeats")) {
            if (tsr_cli_parse_int("probe", a, v, 1, 100, &n)) return 2;
            po.repeats = (int)n;
        } else if (!strcmp(a, "--gemm-n")) {
            if (tsr_cli_parse_int("probe", a, v, 16, 16384, &n)) return 2;
            po.gemm_n = (int)n;
        } else {
            fprintf(stderr, "tessera probe: unknown option %s\n", a);
            probe_usage(stderr);
            return 2;
        }
    }
    tsr_probe_result r;
    tsr_error err;
    tsr_error_clear(&err);
    char msg[2048];
    if (tsr_probe_run(&po, &r, &err) != TSR_OK) {
        fprintf(stderr, "tessera probe: %s\n", tsr_error_format(&err, msg, sizeof msg));
        return 1;
    }
    json_t *j = tsr_probe_to_json(&r);
    int bad = !j || (out ? json_dump_file(j, out, JSON_INDENT(2)) : json_dumpf(j, stdout, JSON_INDENT(2)));
    if (!out) putchar('\n');
    json_decref(j);
    if (bad) {
        fprintf(stderr, "tessera probe: cannot write %s\n", out ? out : "the record");
        return 1;
    }
    fprintf(stderr,
            "tessera probe: read %.2f GB/s (median; %.2f sustained over a second; %d threads, %zu MiB; %s), "
            "sgemm %.1f GFLOP/s%s, FMA peak %.1f GFLOP/s\n",
            r.read_gbs, r.read_gbs_sustained, r.n_threads, r.buffer_bytes >> 20, r.read_loop, r.gemm_gflops,
            r.have_gemm ? "" : " (no cblas)", r.fma_gflops);
    if (r.have_gpu)
        fprintf(stderr, "tessera probe: %s: read %.0f GB/s, bf16 %.0f TFLOP/s, fp8 %.0f TFLOP/s%s%s\n",
                r.gpu_name, r.gpu_read_gbs, r.gpu_bf16_tflops, r.gpu_fp8_tflops,
                r.gpu_note[0] ? "; " : "", r.gpu_note);
    return 0;
}
