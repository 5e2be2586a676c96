/*
 * halloc.h - the host runtime's one allocator.
 *
 * Every allocation the host runtime makes (documents, manifests, the engine,
 * plugin instances and the memory plugins ask for) goes through here, so a
 * test can make the Nth allocation fail (Lua's memcontrol, SQLite's
 * sqlite3_test_control) and check that the failing call unwinds cleanly and
 * leaks nothing (tsr_halloc_live() back to where it was).
 */
#ifndef TSR_HALLOC_H
#define TSR_HALLOC_H

#include <stddef.h>
#include <stdint.h>

void *tsr_halloc(size_t size);                 /* NULL on failure; size 0 allocates 1 byte */
void *tsr_hcalloc(size_t n, size_t size);      /* zeroed; NULL on failure or overflow */
void *tsr_hrealloc(void *p, size_t size);      /* NULL on failure (p untouched) */
void tsr_hfree(void *p);                       /* NULL does nothing */
char *tsr_hstrdup(const char *s);              /* NULL if s is NULL or on failure */
char *tsr_hstrndup(const char *s, size_t n);

/* Grow *v (elements of elem bytes) so that it holds at least need; capacity
 * in *cap. Returns 0, or -1 on overflow or allocation failure (*v untouched). */
int tsr_hgrow(void **v, size_t elem, int need, int *cap);

/* Test hooks. fail_at(n): the nth allocation from now fails (1 = the next
 * one), and every one after it succeeds again; 0 turns it off.
 * live(): allocations not yet freed. count(): allocations made so far. */
void tsr_halloc_fail_at(uint64_t n);
uint64_t tsr_halloc_live(void);
uint64_t tsr_halloc_count(void);

#endif /* TSR_HALLOC_H */
