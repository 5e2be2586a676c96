/*
 * sha256.h - SHA-256 (FIPS 180-4) of a buffer or a file, for the manifest's
 * sha256 of its library.
 */
#ifndef TSR_SHA256_H
#define TSR_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct tsr_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    size_t n;
} tsr_sha256;

void tsr_sha256_init(tsr_sha256 *s);
void tsr_sha256_update(tsr_sha256 *s, const void *data, size_t len);
void tsr_sha256_final(tsr_sha256 *s, uint8_t out[32]);
/* Lowercase hex of the whole file into hex[65]; -1 (errno set) if unreadable. */
int tsr_sha256_file(const char *path, char hex[65]);

#endif /* TSR_SHA256_H */
