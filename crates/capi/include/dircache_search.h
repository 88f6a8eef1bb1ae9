/* dircache search: the C API of "Search Should Be a System Call" (Kokoszka et al., 2013).
 *
 *   SEARCH *s = opensearch("/bin:/usr/bin", "/chmod", SEARCH_INCLUDEROOT|SEARCH_STOPATFIRST|SEARCH_X_OK);
 *   struct search_result r;
 *   while (readsearch(s, &r) == 1)
 *       if (!r.errsource) puts(r.path);
 *   closesearch(s);
 *
 * Link with -ldircachesearch. Pattern syntax: `*` any run except '/', `?` zero or one
 * character, `|` alternatives, '/' literal; a leading '/' anchors at the searched directory
 * and makes the search non-recursive. Below the given directories symlinks are not followed.
 * When the directories lie in a dircache mount, the search is sent to its daemon in one request
 * (set DIRCACHE_NO_DELEGATE=1 to always search locally).
 */
#ifndef DIRCACHE_SEARCH_H
#define DIRCACHE_SEARCH_H

#include <sys/stat.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEARCH_STOPATFIRST 0x01 /* halt at the first match */
#define SEARCH_METADATA    0x02 /* fill `info` (lstat of the entry) */
#define SEARCH_INCLUDEROOT 0x04 /* prefix paths with the directory they were found in */
#define SEARCH_R_OK        0x08 /* only entries the caller may read (access(2) semantics, effective ids) */
#define SEARCH_W_OK        0x10 /* ... write */
#define SEARCH_X_OK        0x20 /* ... execute */

/* errsource: which operation failed for an error result (0 for a match). */
#define SEARCH_ERR_NONE     0
#define SEARCH_ERR_OPEN     1 /* opening a directory */
#define SEARCH_ERR_READDIR  2 /* reading a directory */
#define SEARCH_ERR_STAT     3 /* stat of an entry (e.g. it vanished) */
#define SEARCH_ERR_DELEGATE 4 /* the mount's daemon went away mid-search */

typedef struct SEARCH SEARCH;

struct search_result {
    const char *path;         /* valid until the next readsearch() or closesearch() */
    const struct stat *info;  /* NULL unless SEARCH_METADATA (and errsource == 0) */
    int errsource;            /* SEARCH_ERR_* */
    int err;                  /* errno of the failed operation, 0 for a match */
    unsigned root;            /* index of the directory in `paths` */
};

/* Start a search. Returns NULL and sets errno on bad input: EINVAL (empty paths, invalid
 * pattern, unknown flags, not UTF-8), ENOTDIR (a path is not a directory). */
SEARCH *opensearch(const char *paths, const char *pattern, int flags);

/* Next result: 1 and *out filled, 0 at the end, -1 with errno on misuse. */
int readsearch(SEARCH *search, struct search_result *out);

/* Stop the search (if still running) and free everything. Returns 0. */
int closesearch(SEARCH *search);

#ifdef __cplusplus
}
#endif
#endif
