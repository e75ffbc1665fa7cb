/* st_store_id.c — see st_store_id.h. */
#include "st_store_id.h"

#include <stdlib.h>

#include "st_util.h"

int st_store_id(const struct st_store *s, uint64_t *ret, struct st_diag *diag)
{
	char path[4096], *txt;
	size_t len;
	int r = st_store_path(s, ST_STORE_MANIFEST, path, sizeof(path));

	if (r == 0)
		r = st_read_file(path, &txt, &len);
	if (r < 0)
		return st_diag_set(diag, r, "cannot read %s/%s: %s", s->dir,
				   ST_STORE_MANIFEST, st_strerror(r));
	*ret = st_xxh3(txt, len);
	free(txt);
	return 0;
}
