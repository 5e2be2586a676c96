/*
 * panel_lab.c - does a bf16 decode GEMV of wide rows read faster from column
 * panels?
 *
 * One thread streams a bf16 matrix (rows x cols, enough copies in 2 MiB
 * pages that every pass comes from DRAM) through the shape of cpu_gemv's
 * decode kernel (a 64-byte step: two 32-byte loads split into even and odd
 * halves, four FMA chains, prefetch 3 KiB ahead), in round-robin so that
 * every variant sees the same moments of the VM:
 *   read       the probe's loop over the same bytes (no output)
 *   rows       row after row, each row's dot product whole (cpu_gemv now)
 *   panel B    the same bytes as column panels of B columns: panel p holds
 *              columns [p B, p B + B) of every row, row after row; each
 *              panel's sums are added into y (one contiguous run a panel,
 *              B x 4 bytes of x a row)
 *   strided B  row-major bytes read in the panels' order: for every take
 *              of R rows (R = -B on the command line), each row's piece of
 *              a panel, prefetching the next row's piece
 * On the sixteenth session's Xeon VM (BENCHMARKS.md) rows of 2,560 to 6,144
 * columns (x 10-24 KiB) read 12-13 GB/s where 896 or 6,656+ read 16-18 and
 * the read loop 17-19; panels of 608-1,216 columns read 16-18.
 *
 *   gcc -O2 -mavx2 -mfma -o /tmp/panel_lab tools/cpu_lab/panel_lab.c
 *   /tmp/panel_lab ROWS COLS SECONDS [B | -R]...   e.g. 896 4864 8 608 1216 -32
 * Run two at once (taskset -c 0 / -c 1) for both cores.
 */
#include "lab.h"

#define MAXV 10

__attribute__((noinline)) static void gemv_rows(const uint8_t *w, const float *x, int n, long rows, float *y) {
    for (long r = 0; r < rows; r++) y[r] = row_dot(w + r * n * 2, x, n, PF);
}

/* Panels of b columns (the last the rest), stored one after another. */
__attribute__((noinline)) static void gemv_panels(const uint8_t *w, const float *x, int n, long rows, float *y,
                                                  int b) {
    for (int c0 = 0; c0 < n; c0 += b) {
        const int pc = c0 + b <= n ? b : n - c0;
        for (long r = 0; r < rows; r++) {
            const float s = row_dot(w + r * pc * 2, x + c0, pc, PF);
            y[r] = c0 ? y[r] + s : s;
        }
        w += (size_t)rows * pc * 2;
    }
}

/* Row-major bytes in the panels' order, takes of t rows. */
__attribute__((noinline)) static void gemv_strided(const uint8_t *w, const float *x, int n, long rows, float *y,
                                                   int b, int t) {
    const long rb = 2L * n;
    for (long r0 = 0; r0 < rows; r0 += t) {
        const long r1 = r0 + t < rows ? r0 + t : rows;
        for (int c0 = 0; c0 < n; c0 += b) {
            const int pc = c0 + b <= n ? b : n - c0;
            for (long r = r0; r < r1; r++) {
                const float s = row_dot(w + r * rb + 2L * c0, x + c0, pc, rb);
                y[r] = c0 ? y[r] + s : s;
            }
        }
    }
}

static int cmp_d(const void *a, const void *b) {
    const double p = *(const double *)a, q = *(const double *)b;
    return (p > q) - (p < q);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s ROWS COLS SECONDS [B | -R]...\n", argv[0]);
        return 2;
    }
    const long rows = atol(argv[1]);
    const int n = atoi(argv[2]);
    const double secs = atof(argv[3]);
    int arg[MAXV], nv = 2;
    for (int i = 4; i < argc && nv < MAXV; i++) arg[nv++] = atoi(argv[i]);
    if (rows < 1 || n < 32 || n % 32) {
        fprintf(stderr, "panel_lab: COLS a multiple of 32\n");
        return 2;
    }
    const size_t mb = (size_t)rows * n * 2;
    const int copies = (int)((1500L << 20) / mb + 1);
    const size_t tot = (mb * copies + (2 << 20)) / (2 << 20) * (2 << 20);
    uint8_t *w = aligned_alloc(2 << 20, tot);
    float *x = aligned_alloc(64, (size_t)n * 4), *y = aligned_alloc(64, (size_t)rows * 4 + 64);
    if (!w || !x || !y) return 1;
    madvise(w, tot, MADV_HUGEPAGE);
    lab_fill(w, mb * copies / 2, x, n);
    static double t[MAXV][4000];
    int cnt = 0;
    volatile float sink = 0;
    for (double t0 = now(); now() - t0 < secs && cnt < 4000; cnt++)
        for (int v = 0; v < nv; v++) {
            const uint8_t *c = w + (size_t)((cnt * nv + v) % copies) * mb;
            const double a = now();
            if (v == 0) sink += readloop(c, (long)mb);
            else if (v == 1) gemv_rows(c, x, n, rows, y);
            else if (arg[v] > 0) gemv_panels(c, x, n, rows, y, arg[v]);
            else gemv_strided(c, x, n, rows, y, 1216 < n ? 1216 : n, -arg[v]);
            t[v][cnt] = now() - a;
        }
    for (int v = 0; v < nv; v++) {
        qsort(t[v], (size_t)cnt, sizeof **t, cmp_d);
        char name[32];
        if (v < 2) snprintf(name, sizeof name, "%s", v ? "rows" : "read");
        else if (arg[v] > 0) snprintf(name, sizeof name, "panel %d", arg[v]);
        else snprintf(name, sizeof name, "strided %d", -arg[v]);
        printf("%-12s median %6.2f GB/s (p25 %.2f, p75 %.2f; %d passes)\n", name, mb / t[v][cnt / 2] / 1e9,
               mb / t[v][3 * cnt / 4] / 1e9, mb / t[v][cnt / 4] / 1e9, cnt);
    }
    return 0;
}
