/*
 * detok.c - streaming detokenization: token bytes are held back until they
 * complete a UTF-8 sequence, so a caller printing each push never prints half
 * a character (byte-fallback tokens split emoji and CJK into single bytes).
 * Bytes that can never become valid UTF-8 are replaced by U+FFFD at once.
 */
#include "tokenizer_impl.h"

#include <string.h>

/* Length of the valid sequence at s: >0 complete, 0 incomplete so far
 * (needs more bytes), -1 invalid. Follows RFC 3629 (no overlongs, no
 * surrogates, nothing above U+10FFFF). */
static int utf8_check(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n) return 0;
        unsigned b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -1;
    }
    return need;
}

void tsr_detok_init(tsr_detok *d, const tsr_tokenizer *t, int strip_leading_space) {
    memset(d, 0, sizeof *d);
    d->t = t;
    d->first = 1;
    d->strip_leading_space = strip_leading_space;
}

static size_t put(char *out, size_t size, size_t o, const void *p, size_t n) {
    if (size == 0 || o + n + 1 > size) return o; /* no room: see TSR_DETOK_OUT_MIN */
    memcpy(out + o, p, n);
    return o + n;
}

/* Emit the complete sequences of buf[0..n); keep an incomplete tail if final is 0. */
static size_t emit(tsr_detok *d, const unsigned char *buf, size_t n, int final, char *out, size_t size) {
    size_t o = 0, i = 0;
    d->n_pending = 0;
    while (i < n) {
        int l = utf8_check(buf + i, n - i);
        if (l > 0) {
            o = put(out, size, o, buf + i, (size_t)l);
            i += (size_t)l;
        } else if (l == 0 && !final) {
            memcpy(d->pending, buf + i, n - i); /* at most 3 bytes */
            d->n_pending = (int)(n - i);
            break;
        } else {
            o = put(out, size, o, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
    if (size) out[o] = '\0';
    return o;
}

size_t tsr_detok_push(tsr_detok *d, int id, char *out, size_t size) {
    unsigned char buf[TSR_TOKEN_MAX_TEXT + 16];
    size_t np = (size_t)d->n_pending;
    memcpy(buf, d->pending, np);
    size_t n = tsr_tokenizer_token_bytes(d->t, id, 0, (char *)buf + np, TSR_TOKEN_MAX_TEXT + 1);
    if (n > TSR_TOKEN_MAX_TEXT) n = TSR_TOKEN_MAX_TEXT;
    unsigned char *p = buf + np;
    if (d->first && n > 0) {
        d->first = 0;
        if (d->strip_leading_space && p[0] == ' ') {
            memmove(p, p + 1, n - 1);
            n--;
        }
    }
    return emit(d, buf, np + n, 0, out, size);
}

size_t tsr_detok_flush(tsr_detok *d, char *out, size_t size) {
    unsigned char buf[8];
    size_t np = (size_t)d->n_pending;
    memcpy(buf, d->pending, np);
    return emit(d, buf, np, 1, out, size);
}
