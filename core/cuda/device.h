/*
 * device.h - the CUDA device as the host sees it: whether one is present,
 * accounted device allocations, copies, and a sticky error. Every CUDA call
 * goes through here and is checked; once the device reports an error that
 * poisons the context (a sticky error), tsr_cuda_failed() stays true so the
 * server can fail /health and exit for a supervisor to restart it.
 * Built only with CUDA (TESSERA_CUDA); callers guard with #ifdef.
 */
#ifndef TSR_CUDA_DEVICE_H
#define TSR_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "../util/error.h"

/* Number of CUDA devices (0 when none or no driver). */
int tsr_cuda_device_count(void);
/* Select device id and create the context. */
int tsr_cuda_init(int device_id, tsr_error *err);
/* "NVIDIA H200, 132 SMs, 139.8 GiB, driver 13.0" */
void tsr_cuda_describe(char *buf, size_t size);

/* Device memory, zeroed; NULL on failure (err set). Accounted. */
void *tsr_cuda_malloc(size_t bytes, tsr_error *err);
void tsr_cuda_free(void *p);
uint64_t tsr_cuda_bytes_allocated(void);

int tsr_cuda_upload(void *dst, const void *src, size_t bytes, tsr_error *err);
int tsr_cuda_download(void *dst, const void *src, size_t bytes, tsr_error *err);
/* Wait for the device; report any asynchronous error. */
int tsr_cuda_sync(tsr_error *err);
/* Turn a kernel wrapper's return (0 ok, negative tsr_status) and the
 * device's last error into a status, with what for the message. */
int tsr_cuda_check(int rc, const char *what, tsr_error *err);
/* 1 once the device reported an error that cannot be cleared. */
int tsr_cuda_failed(void);

#endif /* TSR_CUDA_DEVICE_H */
