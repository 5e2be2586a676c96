/*
 * tokenizer.h - text to token ids and back.
 *
 * Kinds: byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama-3
 * and Qwen pre-tokenizer regexes, run with PCRE2 and Unicode properties) or
 * from a GGUF "gpt2" vocabulary; SentencePiece-style BPE with byte fallback
 * (GGUF "llama" vocabularies merged by score, llama2.c's tokenizer.bin, and
 * tokenizer.json with a Metaspace pre-tokenizer or a Prepend/Replace U+2581
 * normalizer, merged by rank as Hugging Face does). Added and special
 * tokens are matched before the model runs on the text between them, longest
 * first: special ones only when parse_special, the others always.
 *
 * Limits (each refused with TSR_ERR_UNSUPPORTED, or documented here):
 * - tokenizer.json: model BPE only (Unigram and WordPiece are refused). The
 *   SentencePiece-style variant is checked against hand-worked cases only, no
 *   real Llama 2 tokenizer.json being at hand here.
 * - The NFC normalizer is applied as the identity: text already in NFC (nearly
 *   all text) encodes exactly; decomposed accents may give other (still
 *   lossless) ids than Hugging Face.
 * - Added tokens' lstrip / rstrip / single_word flags are not applied.
 * - GGUF "deepseek-llm": its letter step uses \p{L&} (Lu, Ll, Lt) for the
 *   explicit ranges of the original regex; encoding stays lossless.
 * - Chat templates are recognised, not interpreted (see tsr_chat_render).
 */
#ifndef TSR_TOKENIZER_H
#define TSR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../util/error.h"

struct tsr_model_file;
struct tsr_gguf;

typedef struct tsr_tokenizer tsr_tokenizer;

/* tokenizer.json (and tokenizer_config.json in the same folder, if present,
 * for bos/eos, add_bos_token and chat_template). */
int tsr_tokenizer_load_json(const char *path, tsr_tokenizer **out, tsr_error *err);
/* The vocabulary stored in GGUF metadata (tokenizer.ggml.*). */
int tsr_tokenizer_load_gguf(const struct tsr_gguf *g, const char *name, tsr_tokenizer **out,
                            tsr_error *err);
/* The same from a buffer (name is used in error messages; no
 * tokenizer_config.json is read). */
int tsr_tokenizer_load_json_mem(const char *buf, size_t len, const char *name, tsr_tokenizer **out,
                                tsr_error *err);
/* llama2.c's tokenizer.bin (e.g. tok512.bin): SentencePiece scores, bos 1, eos 2.
 * vocab_size <= 0: as many tokens as the file holds. */
int tsr_tokenizer_load_llama2c(const char *path, int vocab_size, tsr_tokenizer **out,
                               tsr_error *err);
/* What goes with a model: override_path if not NULL (tokenizer.json or a
 * llama2.c .bin, chosen by content), else the GGUF metadata, else
 * tokenizer.json in the model's folder, else tokenizer.bin / tok*.bin beside
 * a llama2.c checkpoint. */
int tsr_tokenizer_load_for_model(const struct tsr_model_file *f, const char *override_path,
                                 tsr_tokenizer **out, tsr_error *err);
void tsr_tokenizer_free(tsr_tokenizer *t);

int tsr_tokenizer_vocab_size(const tsr_tokenizer *t);
int tsr_tokenizer_bos(const tsr_tokenizer *t);   /* -1 if none */
int tsr_tokenizer_eos(const tsr_tokenizer *t);   /* -1 if none */
/* Whether encode should add BOS by default (add_bos_token / GGUF flag). */
int tsr_tokenizer_adds_bos(const tsr_tokenizer *t);
/* 1 if id is a special/control token (never printed by decode). */
int tsr_tokenizer_is_special(const tsr_tokenizer *t, int id);
/* Id of a token's exact text, -1 if none. */
int tsr_tokenizer_token_id(const tsr_tokenizer *t, const char *text);

/* Encode len bytes of UTF-8 text. add_bos: prepend BOS (if the tokenizer has
 * one). parse_special: match special tokens' text in the input. On success
 * *ids is malloc'ed (caller frees) and *n_ids set. */
int tsr_tokenizer_encode(const tsr_tokenizer *t, const char *text, size_t len, int add_bos,
                         int parse_special, int32_t **ids, int *n_ids, tsr_error *err);

/* Longest token text accepted at load (bytes); a token's decoded bytes never
 * exceed it. */
#define TSR_TOKEN_MAX_BYTES 1024

/* Bytes of one token as it appears in decoded text (SentencePiece "▁" as a
 * space, byte tokens <0xNN> as their byte, byte-level BPE mapped back to
 * bytes). Special tokens give "" unless render_special. Returns the token's
 * length; writes min(length, size) bytes and a NUL when length < size. */
size_t tsr_tokenizer_token_bytes(const tsr_tokenizer *t, int id, int render_special, char *buf,
                                 size_t size);

/* Decode ids to a malloc'ed NUL-terminated string (caller frees). Applies
 * the tokenizer's decoder rules (e.g. SentencePiece strips the leading space
 * that the encoder added when skip_leading_space is 1). NULL on failure. */
char *tsr_tokenizer_decode(const tsr_tokenizer *t, const int32_t *ids, int n, int skip_special);
/* The same with the leading-space rule chosen by the caller: decode strips
 * the first output space exactly when tsr_tokenizer_strips_leading_space(t)
 * (SentencePiece with the dummy prefix), which is right for a whole encoded
 * text; pass 0 to decode a continuation (its leading space is real). */
char *tsr_tokenizer_decode_ex(const tsr_tokenizer *t, const int32_t *ids, int n, int skip_special,
                              int strip_leading_space);
int tsr_tokenizer_strips_leading_space(const tsr_tokenizer *t);
/* The chat_template text found at load, NULL if none. */
const char *tsr_tokenizer_chat_template(const tsr_tokenizer *t);

/* Streaming detokenizer: push ids one at a time and get back only complete
 * UTF-8 sequences; incomplete bytes wait for the next token. Bytes that can
 * never complete a valid sequence are written as U+FFFD at once (decode keeps
 * them raw), so for valid UTF-8 text the pushes concatenate to decode's
 * output. An out buffer of TSR_DETOK_OUT_MIN bytes always holds one push;
 * with less, sequences that do not fit are dropped. */
#define TSR_DETOK_OUT_MIN (3 * (TSR_TOKEN_MAX_BYTES + 8) + 1)
typedef struct tsr_detok {
    const tsr_tokenizer *t;
    char pending[8];
    int n_pending;
    int first;           /* no token emitted yet (SentencePiece leading space) */
    int strip_leading_space;
} tsr_detok;

void tsr_detok_init(tsr_detok *d, const tsr_tokenizer *t, int strip_leading_space);
/* Append the text of id to out (capacity size, NUL-terminated); returns the
 * bytes written, never a split UTF-8 sequence. Special tokens emit nothing. */
size_t tsr_detok_push(tsr_detok *d, int id, char *out, size_t size);
/* Flush what is left (invalid trailing bytes become U+FFFD). */
size_t tsr_detok_flush(tsr_detok *d, char *out, size_t size);

/* Chat templates. */
typedef enum tsr_chat_format {
    TSR_CHAT_NONE = 0,
    TSR_CHAT_CHATML = 1,  /* Qwen: <|im_start|>role\n...<|im_end|>\n */
    TSR_CHAT_LLAMA3 = 2,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    TSR_CHAT_LLAMA2 = 3   /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
} tsr_chat_format;

typedef struct tsr_chat_msg {
    const char *role;     /* "system", "user", "assistant" */
    const char *content;
} tsr_chat_msg;

/* The format the tokenizer's chat_template (tokenizer_config.json or GGUF
 * tokenizer.chat_template) is recognised as; TSR_CHAT_NONE if it has none.
 * An unrecognised template is TSR_ERR_UNSUPPORTED with a message naming the
 * --chat-format option. */
int tsr_chat_format_detect(const tsr_tokenizer *t, tsr_chat_format *out, tsr_error *err);
/* The same for a template text (NULL or "" -> TSR_CHAT_NONE). */
int tsr_chat_format_detect_text(const char *tmpl, tsr_chat_format *out, tsr_error *err);
/* "chatml", "llama3", "llama2" -> format; -1 if unknown. */
int tsr_chat_format_from_name(const char *name);
/* Render messages, ending with the assistant turn opened when add_generation
 * is set. bos_text (NULL = "") starts Llama-3 prompts and every Llama-2 user
 * turn; ChatML has none. Llama-2 closes answers with "</s>" and needs
 * user/assistant turns alternating after an optional system message.
 * Returns a malloc'ed string (caller frees), NULL on failure. */
char *tsr_chat_render(tsr_chat_format fmt, const tsr_chat_msg *msgs, int n, int add_generation,
                      const char *bos_text, tsr_error *err);

#endif /* TSR_TOKENIZER_H */
