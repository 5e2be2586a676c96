/*
 * tokenizer.c - the vocabulary (hash table of token texts), added-token
 * splitting, encode dispatch, decoding and the accessors. The models live in
 * tokenizer_bpe.c and tokenizer_spm.c, the loaders in tokenizer_{json,gguf,
 * llama2c}.c.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer_impl.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "../util/checked.h"

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

size_t tsr_utf8_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    size_t l = 1;
    if (s[0] >= 0xF0 && s[0] < 0xF8) l = 4;
    else if (s[0] >= 0xE0 && s[0] < 0xF0) l = 3;
    else if (s[0] >= 0xC0 && s[0] < 0xE0) l = 2;
    return l < n ? l : n;
}

int tsr_idvec_push(tsr_idvec *v, int32_t id) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 64;
        if (cap < v->cap) return -1;
        int32_t *p = realloc(v->v, (size_t)cap * sizeof *p);
        if (!p) return -1;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = id;
    return 0;
}

tsr_tokenizer *tsr_tok_new(tsr_tok_kind kind, int n_vocab, tsr_error *err) {
    if (n_vocab <= 0 || n_vocab > TSR_TOKEN_MAX_ID) {
        tsr_error_set(err, TSR_ERR_FORMAT, "vocabulary size %d is out of range (1..%d)", n_vocab,
                      TSR_TOKEN_MAX_ID);
        return NULL;
    }
    tsr_tokenizer *t = calloc(1, sizeof *t);
    if (!t) goto nomem;
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->bos = t->eos = t->unk = -1;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    t->text = calloc((size_t)n_vocab, sizeof *t->text);
    t->len = calloc((size_t)n_vocab, sizeof *t->len);
    t->attr = calloc((size_t)n_vocab, 1);
    if (kind == TSR_TOK_SPM) t->score = calloc((size_t)n_vocab, sizeof *t->score);
    if (!t->text || !t->len || !t->attr || (kind == TSR_TOK_SPM && !t->score)) goto nomem;
    return t;
nomem:
    tsr_tokenizer_free(t);
    tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for a vocabulary of %d tokens", n_vocab);
    return NULL;
}

int tsr_tok_set(tsr_tokenizer *t, int id, const char *text, size_t len, uint8_t attr,
                const char *what, tsr_error *err) {
    if (id < 0 || id >= t->n_vocab)
        return tsr_error_set(err, TSR_ERR_FORMAT, "%s: token id %d is out of range (vocabulary of %d)",
                             what, id, t->n_vocab);
    if (t->text[id])
        return tsr_error_set(err, TSR_ERR_FORMAT, "%s: token id %d is given twice", what, id);
    if (len > TSR_TOKEN_MAX_TEXT)
        return tsr_error_set(err, TSR_ERR_FORMAT, "%s: token %d is %zu bytes long (limit %d)", what,
                             id, len, TSR_TOKEN_MAX_TEXT);
    char *p = malloc(len + 1);
    if (!p) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    memcpy(p, text, len);
    p[len] = '\0';
    t->text[id] = p;
    t->len[id] = (uint32_t)len;
    t->attr[id] = attr;
    return TSR_OK;
}

static int map_insert(tsr_tokenizer *t, int id) {
    tsr_strmap *m = &t->map;
    uint32_t mask = m->cap - 1;
    uint32_t h = (uint32_t)hash_bytes(t->text[id], t->len[id]) & mask;
    for (;;) {
        int32_t s = m->slot[h];
        if (s < 0) {
            m->slot[h] = id;
            m->n++;
            return 1;
        }
        if (t->len[s] == t->len[id] && memcmp(t->text[s], t->text[id], t->len[id]) == 0)
            return 0; /* same text twice: the first id wins */
        h = (h + 1) & mask;
    }
}

int tsr_tok_find(const tsr_tokenizer *t, const char *text, size_t len) {
    const tsr_strmap *m = &t->map;
    if (!m->cap) return -1;
    uint32_t mask = m->cap - 1;
    uint32_t h = (uint32_t)hash_bytes(text, len) & mask;
    for (;;) {
        int32_t s = m->slot[h];
        if (s < 0) return -1;
        if (t->len[s] == len && memcmp(t->text[s], text, len) == 0) return s;
        h = (h + 1) & mask;
    }
}

static int cmp_added(const void *a, const void *b, void *ctx) {
    const tsr_tokenizer *t = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    if (t->len[x] != t->len[y]) return t->len[x] > t->len[y] ? -1 : 1;
    return x - y;
}

static int hexdig(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int tsr_tok_finish(tsr_tokenizer *t, tsr_error *err) {
    uint32_t cap = 16;
    while (cap < (uint32_t)t->n_vocab * 2u) cap <<= 1;
    t->map.cap = cap;
    t->map.slot = malloc((size_t)cap * sizeof *t->map.slot);
    if (!t->map.slot) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for the vocabulary");
    memset(t->map.slot, 0xff, (size_t)cap * sizeof *t->map.slot);
    int n_added = 0;
    /* Added tokens first so that their id wins over a plain token of the same text. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < t->n_vocab; i++) {
            if (!t->text[i]) continue;
            int is_added = (t->attr[i] & (TSR_TOKATTR_CONTROL | TSR_TOKATTR_USER)) != 0;
            if (is_added != (pass == 0)) continue;
            map_insert(t, i);
            if (is_added && t->len[i] > 0) n_added++;
        }
    if (n_added) {
        t->added = malloc((size_t)n_added * sizeof *t->added);
        if (!t->added) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        for (int i = 0; i < t->n_vocab; i++)
            if (t->text[i] && t->len[i] > 0 && (t->attr[i] & (TSR_TOKATTR_CONTROL | TSR_TOKATTR_USER)))
                t->added[t->n_added++] = i;
        qsort_r(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added, t);
    }
    if (t->kind == TSR_TOK_BPE) {
        for (int b = 0; b < 256; b++) {
            char c[2];
            int n = tsr_bpe_byte_char((unsigned)b, c);
            t->byte_id[b] = tsr_tok_find(t, c, (size_t)n);
        }
    } else {
        for (int i = 0; i < t->n_vocab; i++) {
            const char *s = t->text[i];
            int is_byte = s && t->len[i] == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
                          hexdig(s[3]) && hexdig(s[4]);
            if (!is_byte) { /* a "byte" token that does not spell one is an ordinary piece */
                if (s && (t->attr[i] & TSR_TOKATTR_BYTE))
                    t->attr[i] = (uint8_t)((t->attr[i] & ~TSR_TOKATTR_BYTE) | TSR_TOKATTR_NORMAL);
                continue;
            }
            char *end;
            char hex[3] = {s[3], s[4], 0};
            long v = strtol(hex, &end, 16);
            if (*end || v < 0 || v > 255) continue;
            if (t->byte_id[v] < 0) t->byte_id[v] = i;
            t->attr[i] = (uint8_t)((t->attr[i] & ~TSR_TOKATTR_NORMAL) | TSR_TOKATTR_BYTE);
        }
    }
    const int special[2] = {t->bos, t->eos};
    for (int k = 0; k < 2; k++)
        if (special[k] >= t->n_vocab || (special[k] >= 0 && !t->text[special[k]]))
            return tsr_error_set(err, TSR_ERR_FORMAT, "%s token id %d is not in the vocabulary",
                                 k == 0 ? "bos" : "eos", special[k]);
    return TSR_OK;
}

void tsr_tokenizer_free(tsr_tokenizer *t) {
    if (!t) return;
    if (t->text)
        for (int i = 0; i < t->n_vocab; i++) free(t->text[i]);
    free(t->text);
    free(t->len);
    free(t->score);
    free(t->attr);
    free(t->map.slot);
    free(t->merges);
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    free(t->added);
    free(t->chat_template);
    free(t);
}

int tsr_tokenizer_vocab_size(const tsr_tokenizer *t) { return t->n_vocab; }
int tsr_tokenizer_bos(const tsr_tokenizer *t) { return t->bos; }
int tsr_tokenizer_eos(const tsr_tokenizer *t) { return t->eos; }
int tsr_tokenizer_adds_bos(const tsr_tokenizer *t) { return t->add_bos && t->bos >= 0; }
const char *tsr_tokenizer_chat_template(const tsr_tokenizer *t) { return t->chat_template; }

int tsr_tokenizer_is_special(const tsr_tokenizer *t, int id) {
    if (id < 0 || id >= t->n_vocab) return 0;
    return (t->attr[id] & (TSR_TOKATTR_CONTROL | TSR_TOKATTR_UNKNOWN)) != 0 || id == t->bos ||
           id == t->eos;
}

int tsr_tokenizer_token_id(const tsr_tokenizer *t, const char *text) {
    return text ? tsr_tok_find(t, text, strlen(text)) : -1;
}

/* The added token (longest first) that starts at s, -1 if none. */
static int match_added(const tsr_tokenizer *t, const char *s, size_t n, int parse_special) {
    for (int k = 0; k < t->n_added; k++) {
        int id = t->added[k];
        if (!parse_special && !(t->attr[id] & TSR_TOKATTR_USER)) continue;
        uint32_t l = t->len[id];
        if (l <= n && t->text[id][0] == s[0] && memcmp(t->text[id], s, l) == 0) return id;
    }
    return -1;
}

static int encode_fragment(const tsr_tokenizer *t, const char *s, size_t n, int prev_special,
                           int at_start, tsr_idvec *v) {
    if (t->kind == TSR_TOK_BPE) return tsr_bpe_encode_text(t, s, n, v);
    int prefix = t->spm_space_prefix && (t->spm_prefix_mode == 1 ||
                                         (t->spm_prefix_mode == 2 ? at_start : prev_special));
    return tsr_spm_encode_text(t, s, n, prefix, v);
}

int tsr_tokenizer_encode(const tsr_tokenizer *t, const char *text, size_t len, int add_bos,
                         int parse_special, int32_t **ids, int *n_ids, tsr_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return tsr_error_set(err, TSR_ERR_INVALID, "encode: text is NULL");
    if (len > (size_t)INT32_MAX / 4)
        return tsr_error_set(err, TSR_ERR_RANGE, "encode: text of %zu bytes is too long", len);
    tsr_idvec v = {0};
    int rc = 0;
    if (add_bos && t->bos >= 0) rc |= tsr_idvec_push(&v, t->bos);
    /* Split on added tokens, then run the model on the text between them
     * (llama.cpp: a text fragment after a special token gets the dummy prefix). */
    size_t start = 0, i = 0;
    int prev_special = 1;
    while (i < len && rc == 0) {
        int id = t->n_added ? match_added(t, text + i, len - i, parse_special) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        if (i > start) {
            rc |= encode_fragment(t, text + start, i - start, prev_special, start == 0, &v);
            prev_special = 0;
        }
        rc |= tsr_idvec_push(&v, id);
        prev_special = 1;
        i += t->len[id];
        start = i;
    }
    if (rc == 0 && len > start)
        rc |= encode_fragment(t, text + start, len - start, prev_special, start == 0, &v);
    if (rc) {
        free(v.v);
        if (rc == -2)
            return tsr_error_set(err, TSR_ERR_RANGE,
                                 "encode: the pre-tokenizer regex gave up (match limit) on this text");
        return tsr_error_set(err, TSR_ERR_NOMEM, "encode: out of memory");
    }
    if (!v.v) v.v = malloc(sizeof *v.v); /* a valid pointer even for no tokens */
    if (!v.v) return tsr_error_set(err, TSR_ERR_NOMEM, "encode: out of memory");
    *ids = v.v;
    *n_ids = v.n;
    return TSR_OK;
}

/* Bytes of a token into buf (at least TSR_TOKEN_MAX_TEXT + 1); returns length. */
static size_t token_bytes(const tsr_tokenizer *t, int id, int render_special, char *buf) {
    if (id < 0 || id >= t->n_vocab || !t->text[id]) return 0;
    uint8_t a = t->attr[id];
    const char *s = t->text[id];
    size_t n = t->len[id];
    if ((a & (TSR_TOKATTR_CONTROL | TSR_TOKATTR_UNKNOWN)) && !render_special) return 0;
    if ((a & TSR_TOKATTR_BYTE) && t->kind == TSR_TOK_SPM) { /* "<0xNN>", checked at load */
        buf[0] = (char)strtol(s + 3, NULL, 16);
        return 1;
    }
    if (t->kind == TSR_TOK_BPE) {
        if (a & (TSR_TOKATTR_RAW | TSR_TOKATTR_CONTROL)) {
            memcpy(buf, s, n);
            return n;
        }
        return tsr_bpe_unmap(s, n, buf, TSR_TOKEN_MAX_TEXT);
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (t->spm_escape && i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            buf[o++] = ' ';
            i += 3;
        } else {
            buf[o++] = s[i++];
        }
    }
    return o;
}

size_t tsr_tokenizer_token_bytes(const tsr_tokenizer *t, int id, int render_special, char *buf,
                                 size_t size) {
    char tmp[TSR_TOKEN_MAX_TEXT + 1];
    size_t n = token_bytes(t, id, render_special, tmp);
    if (size) {
        size_t c = n < size ? n : size;
        memcpy(buf, tmp, c);
        if (n < size) buf[n] = '\0';
    }
    return n;
}

char *tsr_tokenizer_decode_ex(const tsr_tokenizer *t, const int32_t *ids, int n, int skip_special,
                              int strip_leading_space) {
    uint64_t cap;
    if (n < 0 || tsr_muladd_u64((uint64_t)n, TSR_TOKEN_MAX_TEXT, 1, &cap) != 0) return NULL;
    size_t o = 0, sz = 256;
    char *out = malloc(sz);
    char tmp[TSR_TOKEN_MAX_TEXT + 1];
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        size_t l = token_bytes(t, ids[i], !skip_special, tmp);
        const char *p = tmp;
        if (strip_leading_space && o == 0 && l > 0 && p[0] == ' ') {
            p++;
            l--;
            strip_leading_space = 0;
        } else if (l > 0) {
            strip_leading_space = 0;
        }
        if (o + l + 1 > sz) {
            while (o + l + 1 > sz) sz *= 2;
            char *q = realloc(out, sz);
            if (!q) {
                free(out);
                return NULL;
            }
            out = q;
        }
        memcpy(out + o, p, l);
        o += l;
    }
    out[o] = '\0';
    return out;
}

char *tsr_tokenizer_decode(const tsr_tokenizer *t, const int32_t *ids, int n, int skip_special) {
    return tsr_tokenizer_decode_ex(t, ids, n, skip_special,
                                   t->kind == TSR_TOK_SPM && t->spm_space_prefix);
}

int tsr_tokenizer_strips_leading_space(const tsr_tokenizer *t) {
    return t->kind == TSR_TOK_SPM && t->spm_space_prefix;
}
