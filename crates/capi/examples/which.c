/* which: search directories with the dircache C API.
 *
 *   which PATHS PATTERN [FLAGS]
 *
 * FLAGS is a number (SEARCH_* bits). Prints one line per result:
 *   match:  <root-index> <path> [<size> <mode-octal>]   (size and mode only with SEARCH_METADATA)
 *   error:  ! <root-index> <path> <errsource> <errno>
 * Exit status: 0 if something matched, 1 if nothing matched, 2 on bad input.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dircache_search.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PATHS PATTERN [FLAGS]\n", argv[0]);
        return 2;
    }
    int flags = argc > 3 ? atoi(argv[3]) : 0;
    SEARCH *s = opensearch(argv[1], argv[2], flags);
    if (!s) {
        fprintf(stderr, "which: %s\n", strerror(errno));
        return 2;
    }
    struct search_result r;
    int found = 0, rc;
    while ((rc = readsearch(s, &r)) == 1) {
        if (r.errsource) {
            printf("! %u %s %d %d\n", r.root, r.path, r.errsource, r.err);
            continue;
        }
        found = 1;
        if (r.info)
            printf("%u %s %lld %o\n", r.root, r.path, (long long)r.info->st_size, (unsigned)r.info->st_mode);
        else
            printf("%u %s\n", r.root, r.path);
    }
    if (rc < 0) {
        fprintf(stderr, "which: readsearch: %s\n", strerror(errno));
        closesearch(s);
        return 2;
    }
    closesearch(s);
    return found ? 0 : 1;
}
