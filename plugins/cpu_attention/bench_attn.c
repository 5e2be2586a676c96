/*
 * bench_attn - decode attention time per token (all layers) at several
 * context lengths, for cpu_attention over cpu_kv_cache (f16, int8; f16 also
 * with the AVX2 kernels where the CPU has AVX-512) and f32 KV, and
 * ref_attention over ref_kv_cache, next to the memory floor:
 * KV bytes read per token over the read bandwidth measured here with the
 * same threads.
 *
 *   TESSERA_CATALOG=build/catalog build/bin/bench_attn [threads] [reps, 3..64]
 *
 * Shape: Qwen2.5-0.5B attention (24 layers, 14 heads, 2 KV heads, head_dim 64).
 */
#include <math.h>
#include <time.h>

#include "kernels/cpu/attn_kernels.h"
#include "plugins/cpu_attention/attn_test_host.h"
#include "slots/tsr_attention.h"
#include "slots/tsr_kv_cache.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bw_job {
    const uint64_t *p;
    int64_t n;
    uint64_t sum[64];
} bw_job;

static void bw_work(void *arg, int64_t i0, int64_t i1, int tid) {
    bw_job *j = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t i = i0 * 1024; i < i1 * 1024; i += 4) {
        s0 += j->p[i], s1 += j->p[i + 1], s2 += j->p[i + 2], s3 += j->p[i + 3];
    }
    j->sum[tid & 63] += s0 + s1 + s2 + s3;
}

/* Read bandwidth (GB/s) over 512 MiB with the pool's threads, median of 5. */
static double read_bandwidth(tsr_threadpool *pool) {
    const int64_t n = (512ll << 20) / 8;
    uint64_t *p = malloc(n * 8);
    if (!p) return 0;
    for (int64_t i = 0; i < n; i++) p[i] = (uint64_t)i;
    bw_job j = {p, n, {0}};
    double r[5];
    for (int k = 0; k < 5; k++) {
        double t = now();
        tsr_threadpool_run(pool, n / 1024, bw_work, &j);
        r[k] = n * 8 / (now() - t) / 1e9;
    }
    free(p);
    qsort(r, 5, sizeof r[0], cmp_d);
    return r[2];
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    if (threads < 1 || reps < 3 || reps > 64) {
        fprintf(stderr, "usage: bench_attn [threads >= 1] [3 <= reps <= 64]\n");
        return 2;
    }
    if (!getenv("TESSERA_CATALOG")) {
        fprintf(stderr, "set TESSERA_CATALOG to the build's catalog folder\n");
        return 2;
    }
    const int L = 24, H = 14, KVH = 2, hd = 64;
    tsr_model_desc m = {.arch = "qwen2", .n_layers = L, .n_heads = H, .n_kv_heads = KVH, .head_dim = hd};
    tsr_threadpool *pool = tsr_threadpool_new(threads);
    double bw = read_bandwidth(pool);
    printf("threads %d, read bandwidth %.1f GB/s (median of 5, 512 MiB)\n", threads, bw);
    printf("%-28s %6s %12s %12s %10s %9s\n", "engine", "ctx", "us/token", "KV MB/token", "floor us", "of floor");
    static const int ctxs[] = {128, 512, 2048};
    static const struct {
        const char *attn, *kv, *dtype, *isa, *label;
    } cfg[] = {
        {"cpu_attention", "cpu_kv_cache", "f16", NULL, "cpu_attention + f16 KV"},
        {"cpu_attention", "cpu_kv_cache", "f16", "avx2", "cpu_attention[avx2] + f16 KV"},
        {"cpu_attention", "cpu_kv_cache", "int8", NULL, "cpu_attention + int8 KV"},
        {"cpu_attention", "ref_kv_cache", NULL, NULL, "cpu_attention + f32 KV"},
        {"ref_attention", "ref_kv_cache", NULL, NULL, "ref_attention + f32 KV"},
    };
    float *q = malloc(sizeof(float) * H * hd), *out = malloc(sizeof(float) * H * hd);
    float *k = malloc(sizeof(float) * 2048 * KVH * hd), *v = malloc(sizeof(float) * 2048 * KVH * hd);
    for (int i = 0; i < H * hd; i++) q[i] = sinf(i * 0.37f);
    for (int i = 0; i < 2048 * KVH * hd; i++) k[i] = sinf(i * 0.011f), v[i] = cosf(i * 0.013f);
    tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = threads};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
        for (size_t ci = 0; ci < 3; ci++) {
            /* the AVX2 row is a comparison for AVX-512 CPUs: elsewhere the auto rows are it */
            if (cfg[c].isa && tsr_attn_isa_level() != TSR_ATTN_ISA_AVX512) break;
            int ctx = ctxs[ci];
            th_inst kvi, at;
            tsr_param p[3] = {{.name = "capacity_tokens", .type = TSR_PARAM_INT, .v.i = 0}};
            if (cfg[c].dtype) p[1] = (tsr_param){.name = "dtype", .type = TSR_PARAM_STRING, .v.s = cfg[c].dtype};
            tsr_param ap[2] = {{.name = "isa", .type = TSR_PARAM_STRING, .v.s = cfg[c].isa}};
            if (th_open(&kvi, cfg[c].kv, &m, p, pool) || th_open(&at, cfg[c].attn, &m, cfg[c].isa ? ap : NULL, pool)) {
                fprintf(stderr, "cannot open %s / %s: %s %s\n", cfg[c].kv, cfg[c].attn, kvi.err, at.err);
                return 1;
            }
            const tsr_kv_cache_i *KI = kvi.desc->iface;
            const tsr_attention_i *AI = at.desc->iface;
            int seq;
            if (KI->seq_alloc(kvi.inst, ctx, &seq)) return 1;
            for (int l = 0; l < L; l++)
                if (KI->append(kvi.inst, seq, l, 0, ctx, k, v, &ex)) return 1;
            tsr_kv_view views[24];
            for (int l = 0; l < L; l++) KI->view(kvi.inst, seq, l, &views[l]);
            double r[64];
            int n_inner = ctx <= 512 ? 20 : 5;
            for (int rep = 0; rep < reps; rep++) {
                double t = now();
                for (int it = 0; it < n_inner; it++)
                    for (int l = 0; l < L; l++) {
                        tsr_attn_args a = {1, ctx - 1, H, KVH, hd, 0.125f, 0, q, &views[l], out};
                        if (AI->run(at.inst, &a, &ex)) {
                            fprintf(stderr, "%s: %s\n", cfg[c].attn, at.err);
                            return 1;
                        }
                    }
                r[rep] = (now() - t) / n_inner;
            }
            qsort(r, reps, sizeof r[0], cmp_d);
            double med = r[reps / 2];
            double esz = views[0].dtype == 1 ? 2 : views[0].dtype == 8 ? 1 : 4;
            double bytes = (double)L * ctx * KVH * (hd * esz + (views[0].dtype == 8 ? 4 : 0)) * 2;
            double floor = bytes / (bw * 1e9);
            printf("%-28s %6d %12.1f %12.3f %10.1f %8.0f%%\n", cfg[c].label, ctx, med * 1e6, bytes / 1e6,
                   floor * 1e6, 100 * floor / med);
            KI->seq_free(kvi.inst, seq);
            th_close(&at);
            th_close(&kvi);
        }
    free(q), free(out), free(k), free(v);
    tsr_threadpool_free(pool);
    return 0;
}
