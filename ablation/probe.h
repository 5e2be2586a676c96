/*
 * probe.h - this machine's ceilings: memory read bandwidth (a streaming read
 * of a buffer far larger than the last-level cache by n threads, the fastest
 * of a few read loops, median of repeats) and the CPU GEMM rate (OpenBLAS sgemm), with a record of the
 * machine (CPU model, cores, memory); on a CUDA build with a device, the
 * device's read bandwidth and cuBLASLt bf16 and fp8 matmul rates (GPU
 * fields are null otherwise, with a note saying why).
 */
#ifndef TSR_ABL_PROBE_H
#define TSR_ABL_PROBE_H

#include <jansson.h>
#include <stddef.h>

#include "../core/util/error.h"

typedef struct tsr_probe_opts {
    int n_threads;        /* 0: every online core */
    size_t buffer_bytes;  /* 0: 8 x the last-level cache, at least 256 MiB */
    int repeats;          /* 0: 5 */
    int gemm_n;           /* square sgemm size; 0: 1024 */
} tsr_probe_opts;

typedef struct tsr_probe_result {
    double read_gbs;          /* median, GB/s (1e9 bytes) */
    double read_gbs_min, read_gbs_max;
    /* passes back to back for at least a second: bytes over the whole time
     * (what a seconds-long decode sees where the rate moves from pass to
     * pass; the median of 10 ms passes does not weigh the slow ones by the
     * time they take) */
    double read_gbs_sustained;
    char read_loop[96];       /* the read loop that was fastest (probe.c), or "" */
    double gemm_gflops;       /* median, GFLOP/s */
    double gemm_gflops_min, gemm_gflops_max;
    int have_gemm;            /* 0: built without cblas (then the rate is 0) */
    /* f32 multiply-adds in registers on every thread (AVX2 + FMA), median,
     * GFLOP/s: the ceiling of a compute-bound prefill; NAN: not measured */
    double fma_gflops, fma_gflops_min, fma_gflops_max;
    int fma_avx512;           /* 1: measured with AVX-512 FMAs (the CPU has them), else AVX2 */
    int n_threads;
    size_t buffer_bytes;
    int repeats, gemm_n;
    char cpu_model[256];
    int n_cores;              /* online logical CPUs */
    unsigned long long mem_bytes;
    unsigned long long llc_bytes; /* 0 if unknown */
    int have_gpu;             /* a CUDA device was probed */
    char gpu_name[256];
    double gpu_read_gbs, gpu_read_gbs_min, gpu_read_gbs_max; /* NAN: not measured */
    double gpu_bf16_tflops, gpu_fp8_tflops;                  /* NAN: not measured */
    char gpu_note[512];       /* why a GPU figure is missing, or "" */
} tsr_probe_result;

int tsr_probe_run(const tsr_probe_opts *o, tsr_probe_result *r, tsr_error *err);

/* Reads to pair with another measurement taken at the same moment (`tessera
 * passes --floor`: this VM's read rate moves by a third within minutes, so
 * a probe taken seconds apart says little about a pass). The probe's read
 * loops are tried once at new (three passes each over the buffer, the
 * fastest median's loop kept); each pass then reads the next window of
 * window_bytes of a buffer of buffer_bytes (0: 8 x the last-level cache,
 * at least 256 MiB, as the probe's),
 * at least four windows (windows in turn: none is still in a cache from the
 * pass before) on n_threads threads, and returns its rate in GB/s (1e9
 * bytes), -1 where the threads cannot be started. */
typedef struct tsr_probe_reader tsr_probe_reader;
int tsr_probe_reader_new(int n_threads, size_t window_bytes, size_t buffer_bytes, tsr_probe_reader **out,
                         tsr_error *err);
double tsr_probe_reader_pass(tsr_probe_reader *rd);
const char *tsr_probe_reader_loop(const tsr_probe_reader *rd); /* the loop's name, as memory_read.loop */
void tsr_probe_reader_free(tsr_probe_reader *rd);

/* device.json (schema "tessera.device/1"); NULL on no memory. */
json_t *tsr_probe_to_json(const tsr_probe_result *r);
/* Read it back (from `tessera probe --out` or result.json's "device"). */
int tsr_probe_from_json(const json_t *j, tsr_probe_result *r, tsr_error *err);

/* The ablation's JSON numbers: x, or null where not finite (json_real
 * refuses NaN); and back, NAN where o[key] is null, absent or no number. */
json_t *tsr_jnum(double x);
double tsr_jnum_at(const json_t *o, const char *key);

#endif
