/*
 * tokenizer_bpe.c - byte-level BPE (GPT-2 family: GPT-2, Llama-3, Qwen,
 * deepseek): pre-tokenizer regexes run with PCRE2 (UTF-8, Unicode
 * properties), each piece mapped to GPT-2's printable byte alphabet, then
 * merged pair by pair in rank order with a binary heap (O(n log n) per piece).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer_impl.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes are moved to U+0100.. in byte order. */
static int byte_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

static unsigned byte_to_cp(unsigned b) {
    if (byte_printable(b)) return b;
    unsigned n = 0;
    for (unsigned i = 0; i < b; i++) n += !byte_printable(i);
    return 256 + n;
}

int tsr_bpe_byte_char(unsigned b, char out[2]) {
    unsigned cp = byte_to_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* The byte a byte-level character stands for, -1 if none. The 68 moved
 * bytes are 0..32, 127..160 and 173, in that order from U+0100. */
static int cp_to_byte(unsigned cp) {
    if (cp < 256) return byte_printable(cp) ? (int)cp : -1;
    unsigned n = cp - 256;
    if (n < 33) return (int)n;
    if (n < 67) return (int)(127 + n - 33);
    if (n == 67) return 173;
    return -1;
}

size_t tsr_bpe_unmap(const char *s, size_t len, char *out, size_t size) {
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < len && o < size;) {
        size_t l = tsr_utf8_len(u + i, len - i);
        unsigned cp = u[i];
        if (l == 2) cp = ((u[i] & 0x1Fu) << 6) | (u[i + 1] & 0x3Fu);
        if ((l == 1 && cp < 0x80) || l == 2) {
            int b = cp_to_byte(cp);
            if (b >= 0) {
                out[o++] = (char)b;
                i += l;
                continue;
            }
        }
        /* Not in the byte alphabet: keep the bytes as they are. */
        for (size_t k = 0; k < l && o < size; k++) out[o++] = s[i + k];
        i += l;
    }
    return o;
}

/* --- merges: open-addressing hash of (left, right) ----------------------- */

static uint32_t pair_hash(int32_t a, int32_t b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (uint32_t)h;
}

int tsr_bpe_reserve_merges(tsr_tokenizer *t, uint64_t n, tsr_error *err) {
    if (n > (uint64_t)TSR_TOKEN_MAX_ID * 4)
        return tsr_error_set(err, TSR_ERR_FORMAT, "%llu merges is more than this reader accepts",
                             (unsigned long long)n);
    uint32_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    free(t->merges);
    t->merges = malloc((size_t)cap * sizeof *t->merges);
    if (!t->merges) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for %llu merges",
                                         (unsigned long long)n);
    for (uint32_t i = 0; i < cap; i++) t->merges[i].left = -1;
    t->merge_cap = cap;
    t->n_merges = 0;
    return TSR_OK;
}

static const struct tsr_merge *merge_find(const tsr_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merge_cap) return NULL;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t h = pair_hash(a, b) & mask;; h = (h + 1) & mask) {
        const struct tsr_merge *m = &t->merges[h];
        if (m->left < 0) return NULL;
        if (m->left == a && m->right == b) return m;
    }
}

int tsr_bpe_add_merge(tsr_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                      const char *what, tsr_error *err) {
    if ((uint64_t)(t->n_merges + 1) * 2 > t->merge_cap)
        return tsr_error_set(err, TSR_ERR_INVALID, "%s: more merges than reserved", what);
    int ia = tsr_tok_find(t, a, alen), ib = tsr_tok_find(t, b, blen);
    if (ia < 0 || ib < 0)
        return tsr_error_set(err, TSR_ERR_FORMAT, "%s: '%.*s' is not in the vocabulary", what,
                             (int)(ia < 0 ? (alen > 64 ? 64 : alen) : (blen > 64 ? 64 : blen)),
                             ia < 0 ? a : b);
    char buf[2 * TSR_TOKEN_MAX_TEXT];
    if (alen + blen > sizeof buf)
        return tsr_error_set(err, TSR_ERR_FORMAT, "%s: merged token is too long", what);
    memcpy(buf, a, alen);
    memcpy(buf + alen, b, blen);
    int r = tsr_tok_find(t, buf, alen + blen);
    if (r < 0)
        return tsr_error_set(err, TSR_ERR_FORMAT, "%s: the merged token '%.*s' is not in the vocabulary",
                             what, (int)(alen + blen > 64 ? 64 : alen + blen), buf);
    int rank = t->n_merges++;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t h = pair_hash(ia, ib) & mask;; h = (h + 1) & mask) {
        struct tsr_merge *m = &t->merges[h];
        if (m->left == ia && m->right == ib) return TSR_OK; /* repeated merge: first rank wins */
        if (m->left < 0) {
            m->left = ia;
            m->right = ib;
            m->rank = rank;
            m->result = r;
            return TSR_OK;
        }
    }
}

/* --- pre-tokenizer --------------------------------------------------------- */

int tsr_bpe_add_regex(tsr_tokenizer *t, const char *pattern, const char *what, tsr_error *err) {
    if (t->n_re >= TSR_TOK_MAX_REGEX)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer regexes", what,
                             TSR_TOK_MAX_REGEX);
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &off, NULL);
    if (!re) {
        char msg[256];
        pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof msg);
        return tsr_error_set(err, TSR_ERR_FORMAT, "%s: regex does not compile at offset %zu: %s", what,
                             (size_t)off, msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    t->re[t->n_re++] = re;
    return TSR_OK;
}

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3_A "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_B " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

int tsr_bpe_add_pre_named(tsr_tokenizer *t, const char *pre, tsr_error *err) {
    if (!strcmp(pre, "gpt-2") || !strcmp(pre, "gpt2") || !strcmp(pre, "default"))
        return tsr_bpe_add_regex(t, RE_GPT2, pre, err);
    if (!strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe")) {
        t->ignore_merges = 1;
        return tsr_bpe_add_regex(t, RE_LLAMA3_A "\\p{N}{1,3}|" RE_LLAMA3_B, pre, err);
    }
    if (!strcmp(pre, "qwen2")) return tsr_bpe_add_regex(t, RE_LLAMA3_A "\\p{N}|" RE_LLAMA3_B, pre, err);
    if (!strcmp(pre, "deepseek-llm")) {
        /* deepseek-llm's tokenizer.json splits in six steps. Its second step
         * lists the cased letters as explicit ranges; \p{L&} (Lu, Ll, Lt) is
         * the Unicode property those ranges spell out. */
        static const char *const steps[] = {
            "[\\r\\n]",
            "\\s?\\p{L&}+",
            "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
            "\\s+$",
            "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
            "\\p{N}+",
        };
        for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
            int rc = tsr_bpe_add_regex(t, steps[i], pre, err);
            if (rc) return rc;
        }
        return TSR_OK;
    }
    return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                         "tokenizer.ggml.pre '%s' is not supported (known: gpt-2, default, llama3, "
                         "llama-bpe, qwen2, deepseek-llm)",
                         pre);
}

/* --- encoding -------------------------------------------------------------- */

typedef struct heap_ent {
    int32_t rank, pos, left, right;
} heap_ent;

typedef struct bpe_scratch {
    int32_t *id, *prev, *next;
    heap_ent *heap;
    char *word;
    size_t cap;
    pcre2_match_data *md;
    pcre2_match_context *mc;
} bpe_scratch;

static int heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_ent *h, int *n, heap_ent e) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, int *n) {
    heap_ent top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static int scratch_reserve(bpe_scratch *s, size_t n) {
    if (n <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(s->id, cap * sizeof *a);
    if (!a) return -1;
    s->id = a;
    if (!(a = realloc(s->prev, cap * sizeof *a))) return -1;
    s->prev = a;
    if (!(a = realloc(s->next, cap * sizeof *a))) return -1;
    s->next = a;
    /* each merge pushes at most two pairs: 3n bounds the heap */
    heap_ent *h = realloc(s->heap, 3 * cap * sizeof *h);
    if (!h) return -1;
    s->heap = h;
    char *w = realloc(s->word, 2 * cap);
    if (!w) return -1;
    s->word = w;
    s->cap = cap;
    return 0;
}

static void push_pair(const tsr_tokenizer *t, bpe_scratch *s, int *nh, int l) {
    int r = s->next[l];
    if (r < 0) return;
    const struct tsr_merge *m = merge_find(t, s->id[l], s->id[r]);
    if (m) heap_push(s->heap, nh, (heap_ent){m->rank, l, s->id[l], s->id[r]});
}

static int merge_run(const tsr_tokenizer *t, bpe_scratch *s, int m, tsr_idvec *out);

static int encode_word(const tsr_tokenizer *t, bpe_scratch *s, const unsigned char *w, size_t n,
                       tsr_idvec *out) {
    if (scratch_reserve(s, n)) return -1;
    if (t->ignore_merges) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += (size_t)tsr_bpe_byte_char(w[i], s->word + k);
        int id = tsr_tok_find(t, s->word, k);
        if (id >= 0) return tsr_idvec_push(out, id);
    }
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int id = t->byte_id[w[i]];
        if (id < 0) continue; /* byte not in the vocabulary: dropped, as HF does without unk */
        s->id[m++] = id;
    }
    return merge_run(t, s, m, out);
}

/* Merge the m symbols in s->id by rank and append the result. */
static int merge_run(const tsr_tokenizer *t, bpe_scratch *s, int m, tsr_idvec *out) {
    if (m == 0) return 0;
    for (int i = 0; i < m; i++) {
        s->prev[i] = i - 1;
        s->next[i] = i + 1;
    }
    s->next[m - 1] = -1;
    int nh = 0;
    for (int i = 0; i + 1 < m; i++) push_pair(t, s, &nh, i);
    while (nh > 0) {
        heap_ent e = heap_pop(s->heap, &nh);
        int l = e.pos, r = s->next[l];
        if (s->id[l] != e.left || r < 0 || s->id[r] != e.right) continue; /* stale */
        const struct tsr_merge *mg = merge_find(t, e.left, e.right);
        s->id[l] = mg->result;
        s->id[r] = -1;
        s->next[l] = s->next[r];
        if (s->next[r] >= 0) s->prev[s->next[r]] = l;
        if (s->prev[l] >= 0) push_pair(t, s, &nh, s->prev[l]);
        push_pair(t, s, &nh, l);
    }
    for (int i = 0; i >= 0; i = s->next[i])
        if (tsr_idvec_push(out, s->id[i])) return -1;
    return 0;
}

/* Split [p, p+n) with regex level k ("Isolated": matches and the gaps
 * between them are pieces), recursing into the next level. */
static int split(const tsr_tokenizer *t, bpe_scratch *s, int k, const char *p, size_t n,
                 tsr_idvec *out) {
    if (n == 0) return 0;
    if (k == t->n_re) return encode_word(t, s, (const unsigned char *)p, n, out);
    size_t off = 0, gap = 0;
    while (off < n) {
        int rc = pcre2_match(t->re[k], (PCRE2_SPTR)p, n, off, 0, s->md, s->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -2;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t a = ov[0], b = ov[1];
        if (b <= a) { /* empty match: step one character and search again */
            if (a >= n) break;
            off = a + tsr_utf8_len((const unsigned char *)p + a, n - a);
            continue;
        }
        int r = split(t, s, k + 1, p + gap, a - gap, out);
        if (!r) r = split(t, s, k + 1, p + a, b - a, out);
        if (r) return r;
        off = gap = b;
    }
    return split(t, s, k + 1, p + gap, n - gap, out);
}

int tsr_bpe_encode_text(const tsr_tokenizer *t, const char *text, size_t len, tsr_idvec *out) {
    bpe_scratch s = {0};
    int rc = -1;
    char *pref = NULL;
    if (t->add_prefix_space && len > 0 && text[0] != ' ') {
        pref = malloc(len + 1);
        if (!pref) return -1;
        pref[0] = ' ';
        memcpy(pref + 1, text, len);
        text = pref;
        len++;
    }
    if (t->n_re) {
        s.md = pcre2_match_data_create(1, NULL);
        s.mc = pcre2_match_context_create(NULL);
        if (!s.md || !s.mc) goto done;
        pcre2_set_match_limit(s.mc, 10000000);
        pcre2_set_depth_limit(s.mc, 10000);
    }
    rc = split(t, &s, 0, text, len, out);
done:
    pcre2_match_data_free(s.md);
    pcre2_match_context_free(s.mc);
    free(s.id);
    free(s.prev);
    free(s.next);
    free(s.heap);
    free(s.word);
    free(pref);
    return rc;
}

/* SentencePiece-style BPE from tokenizer.json (merges by rank): one symbol
 * per UTF-8 character of the piece; a character that is not a token becomes
 * its <0xNN> byte tokens (byte_fallback), else unk, else nothing. */
int tsr_bpe_encode_chars(const tsr_tokenizer *t, const char *w, size_t n, tsr_idvec *out) {
    if (n == 0) return 0;
    bpe_scratch s = {0};
    int rc = -1;
    if (scratch_reserve(&s, n)) goto done;
    if (t->ignore_merges) {
        int id = tsr_tok_find(t, w, n);
        if (id >= 0) {
            rc = tsr_idvec_push(out, id);
            goto done;
        }
    }
    int m = 0;
    for (size_t i = 0; i < n;) {
        size_t l = tsr_utf8_len((const unsigned char *)w + i, n - i);
        int id = tsr_tok_find(t, w + i, l);
        if (id >= 0) {
            s.id[m++] = id;
        } else if (t->spm_byte_fallback) {
            for (size_t k = 0; k < l; k++) {
                int b = t->byte_id[(unsigned char)w[i + k]];
                if (b < 0) b = t->unk;
                if (b >= 0) s.id[m++] = b;
            }
        } else if (t->unk >= 0) {
            s.id[m++] = t->unk;
        }
        i += l;
    }
    rc = merge_run(t, &s, m, out);
done:
    free(s.id);
    free(s.prev);
    free(s.next);
    free(s.heap);
    free(s.word);
    return rc;
}
