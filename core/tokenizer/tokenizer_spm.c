/*
 * tokenizer_spm.c - SentencePiece-style BPE (Llama 2, phi-3, llama2.c):
 * the text (with the dummy-prefix space, spaces escaped as U+2581) is split
 * into UTF-8 characters, and the adjacent pair whose concatenation is the
 * highest-scoring token is merged first (leftmost on ties) until no pair is a
 * token. Pieces that are not tokens fall back to <0xNN> byte tokens.
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct spm_sym {
    int32_t start, n, prev, next;
} spm_sym;

typedef struct spm_pair {
    float score;
    int32_t left, right, size;
} spm_pair;

static int pair_before(const spm_pair *a, const spm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(spm_pair *h, int *n, spm_pair e) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!pair_before(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static spm_pair heap_pop(spm_pair *h, int *n) {
    spm_pair top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_before(&h[c + 1], &h[c])) c++;
        if (!pair_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const tsr_tokenizer *t, const char *s, const spm_sym *sym, spm_pair *h, int *nh,
                     int l, int r) {
    if (l < 0 || r < 0) return;
    int32_t size = sym[l].n + sym[r].n;
    int id = tsr_tok_find(t, s + sym[l].start, (size_t)size);
    if (id < 0) return;
    heap_push(h, nh, (spm_pair){t->score[id], l, r, size});
}

int tsr_spm_encode_text(const tsr_tokenizer *t, const char *text, size_t len, int add_prefix,
                        tsr_idvec *out) {
    /* escaped text: at most 3 bytes per input byte plus the prefix */
    size_t cap = 3 * len + 3;
    char *s = malloc(cap);
    spm_sym *sym = malloc((len + 1) * sizeof *sym);
    spm_pair *h = malloc(3 * (len + 1) * sizeof *h);
    int rc = -1;
    if (!s || !sym || !h) goto done;
    size_t n = 0;
    const char *space = t->spm_escape ? "\xe2\x96\x81" : " ";
    size_t sl = strlen(space);
    if (add_prefix) {
        memcpy(s, space, sl);
        n = sl;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s + n, space, sl);
            n += sl;
        } else {
            s[n++] = text[i];
        }
    }
    if (t->spm_rank) { /* tokenizer.json: merges by rank, Metaspace split before each U+2581 */
        size_t st = 0;
        rc = 0;
        for (size_t i = 1; t->spm_split && i + 3 <= n && rc == 0; i++)
            if (memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                rc = tsr_bpe_encode_chars(t, s + st, i - st, out);
                st = i;
            }
        if (rc == 0) rc = tsr_bpe_encode_chars(t, s + st, n - st, out);
        goto done;
    }
    int m = 0;
    for (size_t i = 0; i < n;) {
        size_t l = tsr_utf8_len((const unsigned char *)s + i, n - i);
        sym[m] = (spm_sym){(int32_t)i, (int32_t)l, m - 1, m + 1};
        m++;
        i += l;
    }
    if (m == 0) {
        rc = 0;
        goto done;
    }
    sym[m - 1].next = -1;
    int nh = 0;
    for (int i = 0; i + 1 < m; i++) try_pair(t, s, sym, h, &nh, i, i + 1);
    while (nh > 0) {
        spm_pair p = heap_pop(h, &nh);
        spm_sym *L = &sym[p.left], *R = &sym[p.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != p.size) continue; /* stale */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) sym[R->next].prev = p.left;
        try_pair(t, s, sym, h, &nh, L->prev, p.left);
        try_pair(t, s, sym, h, &nh, p.left, L->next);
    }
    for (int i = 0; i >= 0; i = sym[i].next) {
        int id = tsr_tok_find(t, s + sym[i].start, (size_t)sym[i].n);
        if (id >= 0) {
            if (tsr_idvec_push(out, id)) goto done;
            continue;
        }
        for (int k = 0; k < sym[i].n; k++) {
            int b = t->byte_id[(unsigned char)s[sym[i].start + k]];
            if (b < 0) b = t->unk;
            if (b >= 0 && tsr_idvec_push(out, b)) goto done;
        }
    }
    rc = 0;
done:
    free(s);
    free(sym);
    free(h);
    return rc;
}
