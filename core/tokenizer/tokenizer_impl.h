/*
 * tokenizer_impl.h - what the tokenizer's files share: the tokenizer record,
 * the string -> id hash table, and the builder the loaders fill.
 * Not a public header.
 */
#ifndef TSR_TOKENIZER_IMPL_H
#define TSR_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* Tokens longer than this are refused at load: it bounds every per-token
 * buffer (decode, streaming detokenizer). Real vocabularies stay far below. */
#define TSR_TOKEN_MAX_TEXT TSR_TOKEN_MAX_BYTES
/* Ids at or above this are refused (a huge id would size the vocabulary). */
#define TSR_TOKEN_MAX_ID (1 << 22)
/* Most pre-tokenizer regexes applied in sequence (deepseek-llm uses 6). */
#define TSR_TOK_MAX_REGEX 8

typedef enum tsr_tok_kind {
    TSR_TOK_BPE = 1, /* byte-level BPE, merges by rank */
    TSR_TOK_SPM = 2  /* SentencePiece-style BPE, merges by score, byte fallback */
} tsr_tok_kind;

/* Token attributes (bit flags). */
enum {
    TSR_TOKATTR_NORMAL = 1 << 0,
    TSR_TOKATTR_CONTROL = 1 << 1,      /* bos/eos/<|im_start|>: printed only on request */
    TSR_TOKATTR_USER = 1 << 2,         /* user-defined / non-special added token */
    TSR_TOKATTR_BYTE = 1 << 3,         /* <0xNN> */
    TSR_TOKATTR_UNKNOWN = 1 << 4,      /* <unk> */
    TSR_TOKATTR_UNUSED = 1 << 5,
    TSR_TOKATTR_RAW = 1 << 6           /* text is literal (added tokens), not byte-level */
};

/* Open-addressing hash of byte strings to ids. */
typedef struct tsr_strmap {
    uint32_t cap;   /* power of two */
    uint32_t n;
    int32_t *slot;  /* id, -1 empty */
} tsr_strmap;

struct pcre2_real_code_8;

struct tsr_tokenizer {
    tsr_tok_kind kind;
    int n_vocab;
    char **text;        /* [n_vocab] token text as stored (NUL-terminated), NULL for holes */
    uint32_t *len;      /* [n_vocab] */
    float *score;       /* [n_vocab] SPM scores, NULL for BPE */
    uint8_t *attr;      /* [n_vocab] TSR_TOKATTR_* */
    tsr_strmap map;     /* text -> id */

    /* BPE merges: (left id, right id) -> rank and merged id. */
    uint32_t merge_cap;
    struct tsr_merge *merges;
    int n_merges;
    int ignore_merges;  /* a whole pre-token that is a token is taken as is */
    int byte_id[256];   /* BPE: id of each byte's byte-level char; SPM: <0xNN>; -1 none */
    int add_prefix_space; /* BPE ByteLevel add_prefix_space */

    /* Pre-tokenizer: regexes applied in sequence, each splitting the pieces
     * of the one before ("Isolated": matches and gaps are both pieces). */
    struct pcre2_real_code_8 *re[TSR_TOK_MAX_REGEX];
    int n_re;

    /* SPM */
    int spm_space_prefix;  /* prepend the dummy-prefix space */
    int spm_escape;        /* spaces are written as U+2581 in the vocabulary */
    int spm_rank;          /* tokenizer.json: merge by rank (merges list), not by score */
    int spm_prefix_mode;   /* dummy prefix on: 0 the first fragment and after special tokens
                            * (llama.cpp), 1 every fragment (HF Prepend), 2 the text start only */
    int spm_split;         /* Metaspace split: pieces start at each U+2581 */
    int spm_byte_fallback; /* rank mode: unknown characters become <0xNN> tokens */
    int unk;

    /* Added tokens matched before the model runs, longest first. */
    int *added;
    int n_added;

    int bos, eos, add_bos;
    char *chat_template;
};

struct tsr_merge {
    int32_t left, right;  /* -1 left: empty slot */
    int32_t rank, result;
};

/* --- tokenizer.c: building and shared helpers --------------------------- */

/* A zeroed tokenizer of n_vocab holes (text NULL), bos/eos/unk -1. */
tsr_tokenizer *tsr_tok_new(tsr_tok_kind kind, int n_vocab, tsr_error *err);
/* Set token id's text (copied); refuses duplicates of id, over-long text. */
int tsr_tok_set(tsr_tokenizer *t, int id, const char *text, size_t len, uint8_t attr,
                const char *what, tsr_error *err);
/* After all tokens are set: hash table, byte ids, added-token list. */
int tsr_tok_finish(tsr_tokenizer *t, tsr_error *err);
int tsr_tok_find(const tsr_tokenizer *t, const char *text, size_t len);

/* --- tokenizer_bpe.c ---------------------------------------------------- */
/* Add a merge of two token texts (byte-level strings); rank is its order. */
int tsr_bpe_add_merge(tsr_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                      const char *what, tsr_error *err);
int tsr_bpe_reserve_merges(tsr_tokenizer *t, uint64_t n, tsr_error *err);
/* Compile and append a pre-tokenizer regex. */
int tsr_bpe_add_regex(tsr_tokenizer *t, const char *pattern, const char *what, tsr_error *err);
/* Regexes of a llama.cpp tokenizer.ggml.pre name; TSR_ERR_UNSUPPORTED if unknown. */
int tsr_bpe_add_pre_named(tsr_tokenizer *t, const char *pre, tsr_error *err);
/* Encode one stretch of text with no added tokens in it; appends to the id list. */
typedef struct tsr_idvec {
    int32_t *v;
    int n, cap;
} tsr_idvec;
int tsr_idvec_push(tsr_idvec *v, int32_t id);
int tsr_bpe_encode_text(const tsr_tokenizer *t, const char *s, size_t len, tsr_idvec *out);
/* Byte-level text of a token back to bytes; returns the length written (<= size). */
size_t tsr_bpe_unmap(const char *s, size_t len, char *out, size_t size);
/* The UTF-8 of byte b's byte-level character (1 or 2 bytes). */
int tsr_bpe_byte_char(unsigned b, char out[2]);

int tsr_bpe_encode_chars(const tsr_tokenizer *t, const char *w, size_t n, tsr_idvec *out);

/* --- tokenizer_spm.c ---------------------------------------------------- */
int tsr_spm_encode_text(const tsr_tokenizer *t, const char *s, size_t len, int add_prefix,
                        tsr_idvec *out);

/* --- tokenizer_json_fast.c: model.vocab and model.merges without jansson --- */
/* Spans [beg, end) of model.vocab (span[0..1]) and model.merges (span[2..3],
 * zero if absent) in a tokenizer.json; -1 if the skeleton does not scan. */
int tsr_json_fast_locate(const char *s, size_t n, size_t span[4]);
/* Replace s[beg, end) with an empty object/array of the same length. */
void tsr_json_fast_blank(char *s, size_t beg, size_t end);
int tsr_json_fast_vocab_scan(const char *s, size_t beg, size_t end, const char *file, char **dec, void **ents,
                             int *n_ents, int *n_vocab, tsr_error *err);
int tsr_json_fast_vocab_set(tsr_tokenizer *t, const char *dec, const void *ents, int n, tsr_error *err);
int tsr_json_fast_merges(tsr_tokenizer *t, const char *s, size_t beg, size_t end, const char *file,
                         tsr_error *err);

/* Length of the UTF-8 sequence starting at s (1 for an invalid lead byte,
 * clamped to n). */
size_t tsr_utf8_len(const unsigned char *s, size_t n);

#endif /* TSR_TOKENIZER_IMPL_H */
