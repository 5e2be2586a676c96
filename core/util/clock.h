/*
 * clock.h - the one clock every timing in tessera reads: seconds on the
 * monotonic clock (never jumps with the wall clock).
 */
#ifndef TSR_UTIL_CLOCK_H
#define TSR_UTIL_CLOCK_H

#include <time.h>

static inline double tsr_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* TSR_UTIL_CLOCK_H */
