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

/* The stream every engine launch goes to (tsr_exec.stream; created by
 * tsr_cuda_init, blocking with respect to the legacy stream). */
void *tsr_cuda_stream(void);

/* Page-locked host memory (zeroed), for copies the device makes while a
 * graph replays. NULL on failure (err set). */
void *tsr_cuda_host_alloc(size_t bytes, tsr_error *err);
void tsr_cuda_host_free(void *p);

/* Copies on the engine stream, in stream order: the async ones return at
 * once (src/dst must stay valid until the stream passes them; pinned host
 * memory for capture), the others wait for the stream first. */
int tsr_cuda_upload_async(void *dst, const void *host_src, size_t bytes, tsr_error *err);
int tsr_cuda_download_async(void *host_dst, const void *src, size_t bytes, tsr_error *err);
int tsr_cuda_copy_async(void *dst, const void *src, size_t bytes, tsr_error *err); /* device to device */
int tsr_cuda_upload(void *dst, const void *src, size_t bytes, tsr_error *err);
int tsr_cuda_download(void *dst, const void *src, size_t bytes, tsr_error *err);
/* Wait for the device; report any asynchronous error. */
int tsr_cuda_sync(tsr_error *err);
/* CUDA graphs of the engine stream: capture what is issued on it between
 * begin and end (this thread only) into *graph, an instantiated graph;
 * launch replays it on the stream. end after a failed capture step returns
 * the capture's own error and leaves *graph NULL. */
int tsr_cuda_capture_begin(tsr_error *err);
int tsr_cuda_capture_end(void **graph, tsr_error *err);
int tsr_cuda_graph_launch(void *graph, tsr_error *err);
void tsr_cuda_graph_free(void *graph);

/* Events on the engine stream (timing off): record after what is queued;
 * wait until the stream has passed the record. */
void *tsr_cuda_event_new(tsr_error *err);
int tsr_cuda_event_record(void *ev, tsr_error *err);
int tsr_cuda_event_wait(void *ev, tsr_error *err);
void tsr_cuda_event_free(void *ev);

/* Turn a kernel wrapper's return (0 ok, negative tsr_status) and the
 * device's last error into a status, with what for the message. */
int tsr_cuda_check(int rc, const char *what, tsr_error *err);
/* 1 once the device reported an error that cannot be cleared. */
int tsr_cuda_failed(void);

#endif /* TSR_CUDA_DEVICE_H */
