/*
 * logprobs_lab.c - what a logprobs request costs the host per decoded token:
 * tsr_logprobs (the chosen token's log-probability and its n_top best) over
 * a vocabulary of V pseudo-random logits, the fastest of 30 calls each.
 *   gcc -O2 -I. -o /tmp/logprobs_lab tools/cpu_lab/logprobs_lab.c build/core/runtime/libtsr_runtime.a \
 *       build/kernels/libtsr_kernels.a build/core/util/libtsr_util.a -lm
 *   /tmp/logprobs_lab [V]      (default 151936: Qwen2/3's vocabulary)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/runtime/sampling.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const int V = argc > 1 ? atoi(argv[1]) : 151936;
    float *l = malloc((size_t)(V > 0 ? V : 1) * sizeof *l);
    if (V <= 0 || !l) return fprintf(stderr, "usage: logprobs_lab [V > 0]\n"), 2;
    srand(1);
    for (int i = 0; i < V; i++) l[i] = 20.0f * (float)rand() / (float)RAND_MAX - 10.0f;
    const int tops[3] = {0, 5, 20};
    for (int k = 0; k < 3; k++) {
        tsr_token_info info;
        double best = 1e9;
        for (int r = 0; r < 30; r++) {
            double t = now();
            tsr_logprobs(l, V, V / 2, tops[k], &info);
            t = now() - t;
            if (t < best) best = t;
        }
        printf("V %d, top %2d: %.3f ms (logprob of id %d: %.6f)\n", V, tops[k], best * 1e3, V / 2, info.logprob);
    }
    free(l);
    return 0;
}
