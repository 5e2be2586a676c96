/* Tests of kernels/cpu/ops.h where a SIMD path replaces the scalar one:
 * silu_mul against double precision over a sweep of inputs and tails, and
 * the special values (NaN, infinities, overflow of e^-g) as expf gives them. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kernels/cpu/ops.h"

static void test_silu_mul_accuracy(void **state) {
    (void)state;
    for (int n = 1; n <= 77; n += 19) { /* 8-wide bodies and scalar tails */
        float g[80], u[80], y[80];
        double worst = 0;
        for (int rep = 0; rep < 2000; rep++) {
            for (int i = 0; i < n; i++) {
                g[i] = -30.0f + 60.0f * (float)((rep * 131 + i * 7919) % 10007) / 10007.0f;
                u[i] = 0.5f + (float)(i % 5);
            }
            tsr_silu_mul(y, g, u, n);
            for (int i = 0; i < n; i++) {
                double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * (double)u[i];
                double err = fabs((double)y[i] - ref) / (fabs(ref) + 1e-30);
                if (err > worst) worst = err;
            }
        }
        assert_true(worst < 8 * 1.1920929e-7); /* a few ulp */
    }
}

static void test_silu_mul_specials(void **state) {
    (void)state;
    float g[16] = {NAN, INFINITY, -INFINITY, -100.0f, -88.0f, -89.0f, 100.0f, 0.0f,
                   -0.0f, 1.0f, -1.0f, 20.0f, -20.0f, 3.0f, -3.0f, 0.5f};
    float u[16], y[16];
    for (int i = 0; i < 16; i++) u[i] = 1.0f;
    tsr_silu_mul(y, g, u, 16);
    for (int i = 0; i < 16; i++) {
        float ref = g[i] / (1.0f + expf(-g[i])) * u[i];
        if (isnan(ref)) {
            assert_true(isnan(y[i]));
        } else if (isinf(ref) || ref == 0.0f) {
            assert_true(y[i] == ref);
        } else {
            assert_true(fabsf(y[i] - ref) <= 8 * 1.1920929e-7f * fabsf(ref));
        }
    }
    /* in place, as the runtime calls it */
    float a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b[9];
    for (int i = 0; i < 9; i++) b[i] = a[i] / (1.0f + expf(-a[i])) * 2.0f;
    float two[9] = {2, 2, 2, 2, 2, 2, 2, 2, 2};
    tsr_silu_mul(a, a, two, 9);
    for (int i = 0; i < 9; i++) assert_true(fabsf(a[i] - b[i]) <= 8 * 1.1920929e-7f * fabsf(b[i]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_silu_mul_accuracy),
        cmocka_unit_test(test_silu_mul_specials),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
