/*
 * ystore_lab.c - what a cold output line costs a memory-bound bf16 GEMV.
 *
 * One thread streams a bf16 matrix (rows x cols, enough copies that every
 * pass comes from DRAM) through the shape of cpu_gemv's decode kernel (a
 * 64-byte step: two 32-byte loads split into even and odd halves, four FMA
 * chains, prefetch 3 KiB ahead) against the read loop of `tessera probe`,
 * in round-robin so that every variant sees the same moments of the VM:
 *   read       the probe's loop (no output)
 *   cold-y     one f32 store per row into y, whose lines are in no cache
 *   ring-y     the same stores into a 4 KiB ring that stays cached
 *   run-pfw    cold-y with y's lines of each run of 1,024 rows asked for
 *              with write intent (prefetchw) at the run's start
 *   row-pfw    cold-y with each line of y prefetchw'd 16 rows ahead
 * Run two at once (taskset -c 0 / -c 1) for both cores.
 *
 *   gcc -O2 -mavx2 -mfma -mprfchw -o /tmp/ystore_lab tools/cpu_lab/ystore_lab.c
 *   /tmp/ystore_lab [ROWS [COLS [SECONDS]]]      (default 16384 896 10)
 */
#include "lab.h"

#define NV 5
/* v: 1 cold-y, 2 ring-y, 3 run-pfw, 4 row-pfw */
__attribute__((noinline)) static void gemv(int v, const uint8_t *W, const float *xp, int n, long rows, float *y) {
    for (long r = 0; r < rows; r++) {
        if (v == 3 && (r & 1023) == 0)
            for (long j = r; j < r + 1024 && j < rows; j += 16) _m_prefetchw(y + j);
        if (v == 4 && (r & 15) == 0) _m_prefetchw(y + r + 16);
        float s = row_dot(W + r * n * 2, xp, n, PF);
        y[v == 2 ? (r & 1023) : r] = s;
    }
}
int main(int argc, char **argv) {
    long rows = argc > 1 ? atol(argv[1]) : 16384;
    int n = argc > 2 ? atoi(argv[2]) : 896;
    double secs = argc > 3 ? atof(argv[3]) : 10;
    size_t mb = (size_t)rows * n * 2;
    int copies = (int)((1500L << 20) / mb + 1);
    size_t tot = (mb * copies + (2 << 20)) / (2 << 20) * (2 << 20);
    uint8_t *W = aligned_alloc(2 << 20, tot);
    float *xp = aligned_alloc(64, n * 4), *y = malloc(rows * 4 + 64);
    if (!W || !xp || !y) return 1;
    madvise(W, tot, MADV_HUGEPAGE);
    lab_fill(W, mb * copies / 2, xp, n);
    static const char *name[NV] = {"read", "cold-y", "ring-y", "run-pfw", "row-pfw"};
    static double t[NV][4000];
    int cnt = 0;
    volatile float sink = 0;
    for (double t0 = now(); now() - t0 < secs && cnt < 4000; cnt++)
        for (int v = 0; v < NV; v++) {
            const uint8_t *w = W + (size_t)((cnt * NV + v) % copies) * mb;
            double a = now();
            if (v == 0) sink += readloop(w, (long)mb);
            else gemv(v, w, xp, n, rows, y);
            t[v][cnt] = now() - a;
        }
    for (int v = 0; v < NV; v++) {
        double *s = t[v];
        for (int i = 0; i < cnt; i++)
            for (int j = i + 1; j < cnt; j++)
                if (s[j] < s[i]) { double q = s[i]; s[i] = s[j]; s[j] = q; }
        printf("%-8s median %6.2f GB/s  (p25 %.2f, p75 %.2f; %d passes)\n", name[v], mb / s[cnt / 2] / 1e9,
               mb / s[3 * cnt / 4] / 1e9, mb / s[cnt / 4] / 1e9, cnt);
    }
    return 0;
}
