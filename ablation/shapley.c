#include "shapley.h"

#include <math.h>

int tsr_shapley(int n, const double *v, const unsigned char *known, double *phi, tsr_error *err) {
    if (n < 0 || n > TSR_SHAPLEY_MAX_PLAYERS)
        return tsr_error_set(err, TSR_ERR_INVALID, "Shapley values of %d players (0..%d)", n,
                             TSR_SHAPLEY_MAX_PLAYERS);
    const unsigned full = 1u << n;
    for (unsigned m = 0; m < full; m++) {
        if (known && !known[m])
            return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                                 "no exact Shapley values: coalition 0x%x has no value", m);
        if (!isfinite(v[m]))
            return tsr_error_set(err, TSR_ERR_INVALID, "coalition 0x%x has a non-finite value", m);
    }
    /* weight[k] = k! (n-k-1)! / n! for coalitions of size k without i */
    double weight[TSR_SHAPLEY_MAX_PLAYERS];
    for (int k = 0; k < n; k++) {
        double w = 1.0 / n;
        /* 1 / (n * C(n-1, k)) */
        double c = 1;
        for (int j = 1; j <= k; j++) c = c * (n - 1 - k + j) / j;
        weight[k] = w / c;
    }
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (unsigned m = 0; m < full; m++) {
            if (m & (1u << i)) continue;
            s += weight[__builtin_popcount(m)] * (v[m | (1u << i)] - v[m]);
        }
        phi[i] = s;
    }
    return TSR_OK;
}
