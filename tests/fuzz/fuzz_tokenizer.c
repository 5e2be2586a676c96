/* libFuzzer harness for the tokenizer.
 * Input: 2 bytes (big-endian) of JSON length, that many bytes of
 * tokenizer.json, the rest is text. Whatever tokenizer.json loads is used to
 * encode the text (with and without special tokens), decode and stream it.
 * An input that starts with "GGUF" is read as a GGUF file instead and its
 * vocabulary (tokenizer.ggml.*) is loaded and used.
 * The whole input is also encoded with two fixed small tokenizers that have
 * all 256 bytes (byte-level BPE; SentencePiece with byte fallback), where the
 * tokens' bytes must give back the input exactly; streamed text must always
 * be valid UTF-8. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/format/gguf.h"
#include "core/tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tsr_tokenizer *fixed_tok, *fixed_spm;

/* GPT-2's byte alphabet, written independently of the library's. */
static void byte_char(unsigned b, char *out) {
    unsigned cp = b, n = 0;
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (!printable) {
        for (unsigned i = 0; i < b; i++)
            n += !((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174);
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static void json_str(char **o, const char *s) {
    *(*o)++ = '"';
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') *(*o)++ = '\\';
        *(*o)++ = *s;
    }
    *(*o)++ = '"';
}

static tsr_tokenizer *make_fixed(void) {
    static char buf[16384];
    char *o = buf, c[4];
    o += sprintf(o, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (unsigned b = 0; b < 256; b++) {
        byte_char(b, c);
        json_str(&o, c);
        o += sprintf(o, ":%u,", b);
    }
    o += sprintf(o, "\"\\u0120t\":256,\"he\":257,\"\\u0120the\":258,\"in\":259},"
                    "\"merges\":[\"\\u0120 t\",\"h e\",[\"\\u0120t\",\"he\"],\"i n\"]},"
                    "\"added_tokens\":[{\"id\":260,\"content\":\"<|end|>\",\"special\":true},"
                    "{\"id\":261,\"content\":\"<x>\",\"special\":false}],"
                    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                    "\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
                    "\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
                    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"use_regex\":false}]},"
                    "\"decoder\":{\"type\":\"ByteLevel\"}}");
    tsr_tokenizer *t;
    tsr_error err;
    if (tsr_tokenizer_load_json_mem(buf, (size_t)(o - buf), "fixed.json", &t, &err) != TSR_OK) {
        fprintf(stderr, "fixed tokenizer: %s\n", err.msg);
        abort();
    }
    return t;
}

/* A llama2.c tokenizer with all 256 byte tokens (written once to a
 * temporary file, the only way that format is read). */
static tsr_tokenizer *make_fixed_spm(void) {
    static const char *const pieces[] = {" ", "a", "b", " a", "ab", " ab", "\xc3\xa9", "\xe6\x97\xa5",
                                         "\xe6\x9c\xac", "\xe6\x97\xa5\xe6\x9c\xac", "  ", "<x>"};
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_tokenizer_spm.%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    int32_t maxlen = 16;
    fwrite(&maxlen, 4, 1, f);
    int n = 3 + 256 + (int)(sizeof pieces / sizeof *pieces);
    for (int i = 0; i < n; i++) {
        char buf[16];
        const char *p = buf;
        if (i == 0) p = "<unk>";
        else if (i == 1) p = "\n<s>\n";
        else if (i == 2) p = "\n</s>\n";
        else if (i < 259) snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else p = pieces[i - 259];
        float score = i < 259 ? 0.0f : -(float)(i % 7);
        int32_t len = (int32_t)strlen(p);
        fwrite(&score, 4, 1, f);
        fwrite(&len, 4, 1, f);
        fwrite(p, 1, (size_t)len, f);
    }
    fclose(f);
    tsr_tokenizer *t;
    tsr_error err;
    int rc = tsr_tokenizer_load_llama2c(path, 0, &t, &err);
    remove(path);
    if (rc != TSR_OK) {
        fprintf(stderr, "fixed spm tokenizer: %s\n", err.msg);
        abort();
    }
    return t;
}

static int valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return 0;
        if (i + k >= n || s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

/* Every id (up to a bound) decodes and streams: a model may emit any of them. */
static void every_id(const tsr_tokenizer *t) {
    int n = tsr_tokenizer_vocab_size(t);
    if (n > 4096) n = 4096;
    char piece[TSR_TOKEN_MAX_BYTES + 1], out[TSR_DETOK_OUT_MIN];
    tsr_detok dt;
    tsr_detok_init(&dt, t, 1);
    for (int i = -1; i <= n; i++) {
        if (tsr_tokenizer_token_bytes(t, i, 1, piece, sizeof piece) > TSR_TOKEN_MAX_BYTES) abort();
        size_t k = tsr_detok_push(&dt, i, out, sizeof out);
        if (k >= sizeof out || out[k] != 0 || !valid_utf8((const unsigned char *)out, k)) abort();
    }
}

static void exercise(const tsr_tokenizer *t, const char *text, size_t len, int special, int must_round_trip) {
    int32_t *ids;
    int n;
    tsr_error err;
    if (tsr_tokenizer_encode(t, text, len, !must_round_trip, special, &ids, &n, &err) != TSR_OK) return;
    /* SentencePiece adds the dummy-prefix space to non-empty text */
    size_t pre = must_round_trip && len > 0 && tsr_tokenizer_strips_leading_space(t) ? 1 : 0;
    /* decode == the tokens' bytes joined (up to a NUL in the text) */
    char *d = tsr_tokenizer_decode_ex(t, ids, n, 0, 0);
    if (!d) abort();
    char piece[TSR_TOKEN_MAX_BYTES + 1];
    size_t off = 0, dl = strlen(d);
    int diverged = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tsr_tokenizer_vocab_size(t)) abort();
        size_t k = tsr_tokenizer_token_bytes(t, ids[i], 1, piece, sizeof piece);
        if (k > TSR_TOKEN_MAX_BYTES) abort();
        for (size_t j = 0; must_round_trip && j < k; j++) {
            size_t at = off + j;
            char want = at < pre ? ' ' : at - pre < len ? text[at - pre] : 0;
            if (at - pre >= len && at >= pre) abort(); /* longer than the text */
            if (piece[j] != want) abort();
        }
        for (size_t j = 0; j < k && !diverged; j++, off++)
            if (off < dl && d[off] != piece[j]) diverged = 1;
        if (diverged) abort();
    }
    if (must_round_trip && off != len + pre) abort();
    free(d);
    tsr_detok dt;
    char out[TSR_DETOK_OUT_MIN];
    tsr_detok_init(&dt, t, tsr_tokenizer_strips_leading_space(t));
    for (int i = 0; i <= n; i++) {
        size_t k = i < n ? tsr_detok_push(&dt, ids[i], out, sizeof out) : tsr_detok_flush(&dt, out, sizeof out);
        if (k >= sizeof out || out[k] != 0 || !valid_utf8((const unsigned char *)out, k)) abort();
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fixed_tok) {
        fixed_tok = make_fixed();
        fixed_spm = make_fixed_spm();
    }
    /* the fixed tokenizers: lossless on any bytes when special tokens are not parsed */
    exercise(fixed_tok, (const char *)data, size, 0, 1);
    exercise(fixed_tok, (const char *)data, size, 1, 0);
    exercise(fixed_spm, (const char *)data, size, 0, 1);
    exercise(fixed_spm, (const char *)data, size, 1, 0);
    /* a GGUF file: its tokenizer.ggml.* vocabulary */
    if (size >= 4 && memcmp(data, "GGUF", 4) == 0) {
        tsr_gguf *g;
        tsr_error err;
        if (tsr_gguf_parse(data, size, "fuzz.gguf", &g, &err) == TSR_OK) {
            tsr_tokenizer *t = NULL;
            if (tsr_tokenizer_load_gguf(g, "fuzz.gguf", &t, &err) == TSR_OK) {
                static const char text[] = "Hello w\xc3\xb6rld \xf0\x9f\xa6\x99 <s>[INST] ab a\xff";
                exercise(t, text, sizeof text - 1, 0, 0);
                exercise(t, text, sizeof text - 1, 1, 0);
                every_id(t);
                tsr_chat_format f;
                tsr_chat_format_detect(t, &f, &err);
                tsr_tokenizer_free(t);
            } else if (err.code == TSR_OK || !err.msg[0]) {
                abort();
            }
            tsr_gguf_free(g);
        }
        return 0;
    }
    if (size < 2) return 0;
    size_t jl = ((size_t)data[0] << 8) | data[1];
    if (jl > size - 2) jl = size - 2;
    tsr_tokenizer *t = NULL;
    tsr_error err;
    if (tsr_tokenizer_load_json_mem((const char *)data + 2, jl, "fuzz.json", &t, &err) == TSR_OK) {
        const char *text = (const char *)data + 2 + jl;
        size_t tl = size - 2 - jl;
        exercise(t, text, tl, 0, 0);
        exercise(t, text, tl, 1, 0);
        every_id(t);
        tsr_chat_format f;
        tsr_chat_format_detect(t, &f, &err);
        tsr_tokenizer_free(t);
    } else if (err.code == TSR_OK || !err.msg[0]) {
        abort(); /* a failure must say why */
    }
    return 0;
}
