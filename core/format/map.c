#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format_internal.h"

int tsr_map_file(const char *path, tsr_map *m, tsr_error *err) {
    m->addr = NULL;
    m->size = 0;
    m->fd1 = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "not a regular file");
    }
    if (st.st_size > 0) {
        /* not populated here: the runtime populates each weight it hands a
         * plugin (model.c), and plugins that copy theirs give the pages back */
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot mmap: %s", strerror(e));
        }
        m->addr = p;
        m->size = (uint64_t)st.st_size;
        m->fd1 = fd + 1; /* kept for tsr_map_read */
        return TSR_OK;
    }
    close(fd);
    return TSR_OK;
}

int tsr_map_holds(const tsr_map *m, const void *p, uint64_t n) {
    uintptr_t lo = (uintptr_t)m->addr, a = (uintptr_t)p;
    return m->addr && p && a >= lo && a - lo <= m->size && n <= m->size - (a - lo);
}

int tsr_map_read(const tsr_map *m, const void *p, uint64_t n, void *dst) {
    if (!m->fd1 || !tsr_map_holds(m, p, n)) return 0;
    const uint64_t off = (uint64_t)((uintptr_t)p - (uintptr_t)m->addr);
    uint64_t done = 0;
    while (done < n) {
        ssize_t r = pread(m->fd1 - 1, (uint8_t *)dst + done, (size_t)(n - done), (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        done += (uint64_t)r;
    }
    return 1;
}

uint64_t tsr_map_give_back(const tsr_map *m, const void *p, uint64_t n) {
    if (!tsr_map_holds(m, p, n)) return 0;
    const uintptr_t a = (uintptr_t)p;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t b = (a + page - 1) & ~(page - 1), e = (a + (uintptr_t)n) & ~(page - 1);
    if (e <= b) return 0;
    /* PROT_READ and MAP_PRIVATE: never written, so dropping the pages loses
     * nothing; a later read faults the file's bytes back in */
    if (madvise((void *)b, e - b, MADV_DONTNEED) != 0) return 0;
    return e - b;
}

void tsr_map_release(tsr_map *m) {
    if (m && m->addr) munmap(m->addr, (size_t)m->size);
    if (m && m->fd1) close(m->fd1 - 1);
    if (m) {
        m->addr = NULL;
        m->size = 0;
        m->fd1 = 0;
    }
}

/* --- tensor table -------------------------------------------------------------- */

int tsr_table_add(tsr_tensor_table *tab, const char *name, const tsr_tensor *t) {
    if (tab->n == tab->cap) {
        int cap = tab->cap ? tab->cap * 2 : 64;
        tsr_tensor *nt = realloc(tab->t, (size_t)cap * sizeof *nt);
        if (!nt) return TSR_ERR_NOMEM;
        tab->t = nt;
        tab->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return TSR_ERR_NOMEM;
    tab->t[tab->n] = *t;
    tab->t[tab->n].name = copy;
    tab->n++;
    return TSR_OK;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const tsr_tensor *)a)->name, ((const tsr_tensor *)b)->name);
}

const char *tsr_table_sort(tsr_tensor_table *tab) {
    if (tab->n > 1) qsort(tab->t, (size_t)tab->n, sizeof *tab->t, cmp_tensor_name);
    for (int i = 1; i < tab->n; i++)
        if (strcmp(tab->t[i - 1].name, tab->t[i].name) == 0) return tab->t[i].name;
    return NULL;
}

const tsr_tensor *tsr_table_find(const tsr_tensor_table *tab, const char *name) {
    if (!tab->n || !name) return NULL;
    tsr_tensor key = {.name = name};
    return bsearch(&key, tab->t, (size_t)tab->n, sizeof *tab->t, cmp_tensor_name);
}

void tsr_table_free(tsr_tensor_table *tab) {
    if (!tab) return;
    for (int i = 0; i < tab->n; i++) free((char *)tab->t[i].name);
    free(tab->t);
    tab->t = NULL;
    tab->n = tab->cap = 0;
}
