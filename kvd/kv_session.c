/*
 * kv_session.c — saved sessions (kv_session.h): the file format, saving
 * the cached groups of a conversation, checking a file whole before
 * loading it into the prefix cache, listing and removing.
 */
#include "kv_session.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_daemon.h"
#include "kv_remote.h"
#include "st_formats.h"
#include "st_log.h"
#include "st_le.h"
#include "st_util.h"

#define HDR_BYTES 144u
#define MODEL_OFF 56u
#define SUM_OFF 136u

static const uint8_t k_magic[8] = { 's', 't', 'r', 'a', 't', 'a', 'S', 'S' };

/* The remote tier's key of session name (kv_session.h). */
static void remote_key(const char *name, char *buf, size_t cap)
{
	snprintf(buf, cap, "strata:session:%u:%s", KV_SESSION_FORMAT, name);
}

static int path_of(const char *dir, const char *name, char *buf, size_t cap,
		   struct st_diag *diag)
{
	if (!kv_session_name_ok(name, diag))
		return -EINVAL;
	if ((size_t)snprintf(buf, cap, "%s/%s%s", dir, name,
			     KV_SESSION_SUFFIX) >= cap)
		return st_diag_set(diag, -ENAMETOOLONG, "session directory "
				   "path too long");
	return 0;
}

/* XXH3 of the header's first SUM_OFF bytes followed by the ids. */
static uint64_t header_sum(const uint8_t *h, const uint8_t *ids,
			   uint32_t n_ids)
{
	size_t n = SUM_OFF + (size_t)n_ids * 4;
	uint8_t *b = malloc(n);
	uint64_t s;

	if (!b)
		return 0;
	memcpy(b, h, SUM_OFF);
	memcpy(b + SUM_OFF, ids, (size_t)n_ids * 4);
	s = st_xxh3(b, n);
	free(b);
	return s;
}

static int peek_file(const char *dir, const char *path, uint32_t *ret_rows,
		     char *model, uint64_t *ret_size, char *why, size_t cap);

static const char *dtype_name(uint32_t dt)
{
	const struct st_dtype_traits *t = st_dtype_traits((enum st_dtype)dt);

	return t ? t->name : "unknown";
}

int kv_session_save(struct kv_pool *p, const char *dir, const char *name,
		    const struct kv_session_ident *id, const int32_t *ids,
		    uint32_t n_ids, uint32_t *ret_groups,
		    int32_t *ret_replaced, struct st_diag *diag)
{
	const uint32_t B = p->lay.page_rows, ns = p->lay.n_streams;
	const size_t vl = kv_group_value_len(p);
	uint32_t n_full = n_ids / B, got = 0, pages[KV_MAX_STREAMS], stamp;
	uint64_t *keys = NULL;
	uint8_t *buf = NULL;
	char path[4400], why[256];
	uint32_t old_rows = 0;
	int32_t replaced = -1;
	size_t len;
	int r;

	*ret_groups = 0;
	if (ret_replaced)
		*ret_replaced = -1;
	r = path_of(dir, name, path, sizeof(path), diag);
	if (r < 0)
		return r;
	if (id->page_rows != B)
		return st_diag_set(diag, -EINVAL, "session '%s': page size %u "
				   "rows given, kvd's pool has %u", name,
				   id->page_rows, B);
	if (n_full == 0)
		return st_diag_set(diag, -ST_E_NOTFOUND, "session '%s': %u "
				   "token ids fill no page of %u rows; "
				   "nothing to save", name, n_ids, B);
	n_full = ST_MIN(n_full, p->lay.max_pages_per_seq);
	keys = malloc(sizeof(uint64_t) * n_full);
	len = HDR_BYTES + (size_t)n_ids * 4 + vl * n_full;
	buf = calloc(1, len);
	if (!keys || !buf) {
		r = -ENOMEM;
		goto out;
	}
	r = kv_prefix_keys(ids, B, id->model_id, n_full, keys);
	if (r < 0)
		goto out;
	stamp = kv_mark_begin(p);
	for (; got < n_full; got++) {
		uint8_t *v = buf + HDR_BYTES + (size_t)n_ids * 4 + vl * got;

		r = kv_cache_acquire_resident(p, keys[got], stamp, pages,
					      NULL);
		if (r != 1)
			break;
		for (uint32_t s = 0; s < ns; s++)
			kv_pool_page_sync(p, pages[s]);
		kv_group_value_encode(p, keys[got], pages, v);
		for (uint32_t s = 0; s < ns; s++)
			kv_page_unref(p, pages[s]);
	}
	if (got == 0) {
		r = st_diag_set(diag, -ST_E_NOTFOUND, "session '%s': this "
				"conversation's KV is not cached: nothing was "
				"generated from it on this instance yet, or "
				"its pages were evicted since; run a "
				"completion of exactly this prompt (or these "
				"messages) first, then save again, or save it "
				"in that request with \"session\": "
				"{\"save\": \"%s\"}", name, name);
		goto out;
	}
	memcpy(buf, k_magic, 8);
	st_put_le32(buf + 8, KV_SESSION_FORMAT);
	st_put_le32(buf + 12, ns);
	st_put_le64(buf + 16, id->model_id);
	st_put_le64(buf + 24, id->store_id);
	st_put_le64(buf + 32, kv_pool_decl_hash(p));
	st_put_le32(buf + 40, id->kv_dtype);
	st_put_le32(buf + 44, B);
	st_put_le32(buf + 48, got);
	st_put_le32(buf + 52, n_ids);
	memcpy(buf + MODEL_OFF, id->model, strnlen(id->model, 63));
	st_put_le64(buf + 120, vl);
	for (uint32_t i = 0; i < n_ids; i++)
		st_put_le32(buf + HDR_BYTES + 4 * (size_t)i, (uint32_t)ids[i]);
	st_put_le64(buf + SUM_OFF, header_sum(buf, buf + HDR_BYTES, n_ids));
	/* groups past the first one missing are not written */
	len = HDR_BYTES + (size_t)n_ids * 4 + vl * got;
	r = st_mkdir_p(dir, 0700);
	if (r < 0) {
		st_diag_set(diag, r, "session '%s': the session directory %s "
			    "(kvd --session-dir) is not a usable directory: "
			    "%s", name, dir, st_strerror(r));
		goto out;
	}
	/* an old session of that name is replaced (what save means), and
	 * said so; a link or other non-regular file there is left alone */
	r = peek_file(dir, path, &old_rows, NULL, NULL, why, sizeof(why));
	if (r == -ENOTDIR) {
		st_diag_set(diag, r, "session '%s': %s", name, why);
		goto out;
	}
	if (r == -ELOOP || r == -EPERM || r == -EISDIR) {
		r = st_diag_set(diag, -EEXIST, "session '%s': %s: %s; kvd does "
				"not replace it", name, path, why);
		goto out;
	}
	if (r == -ENOMEM)
		goto out;
	if (r != -ENOENT)
		replaced = r == 0 ? (int32_t)old_rows : 0;
	r = st_write_file_durable(path, buf, len, 0600);
	if (r < 0) {
		st_diag_set(diag, r, "session '%s': writing %s: %s", name,
			    path, st_strerror(r));
		goto out;
	}
	if (p->remote) {
		char key[128];

		remote_key(name, key, sizeof(key));
		r = kv_remote_blob_put(p->remote, key, buf, len,
				       KV_SESSION_REMOTE_TTL_S);
		if (r < 0)
			st_warn("session '%s': saved in %s, not in the remote "
				"KV tier (%s)", name, dir, st_strerror(r));
	}
	*ret_groups = got;
	if (ret_replaced)
		*ret_replaced = replaced;
	r = 0;
out:
	free(keys);
	free(buf);
	return r;
}

/*
 * Opens session file path for reading without following a symbolic link
 * (O_NOFOLLOW; O_NONBLOCK so that a FIFO does not block) and refuses
 * anything but a regular file.  The descriptor in *ret_fd, its size in
 * *ret_size; or -errno with why in buf: -ELOOP a symbolic link, -EISDIR
 * / -EPERM not a regular file, -ENOTDIR the directory is not one.
 */
static int open_file(const char *dir, const char *path, int *ret_fd,
		     uint64_t *ret_size, char *why, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	struct stat st;
	int r;

	if (fd < 0) {
		r = -errno;
		if (r == -ELOOP)
			snprintf(why, cap, "a symbolic link: kvd does not "
				 "follow links in its session directory");
		else if (r == -ENOTDIR)
			snprintf(why, cap, "the session directory %s is not a "
				 "directory (kvd --session-dir)", dir);
		else
			snprintf(why, cap, "%s", st_strerror(r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(why, cap, "%s", st_strerror(r));
		close(fd);
		return r;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, cap, "not a regular file");
		close(fd);
		return S_ISDIR(st.st_mode) ? -EISDIR : -EPERM;
	}
	*ret_fd = fd;
	*ret_size = (uint64_t)st.st_size;
	return 0;
}

/* Reads up to n bytes at the start of fd into b; the count or -errno. */
static ssize_t read_up_to(int fd, uint8_t *b, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = read(fd, b + got, n - got);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		got += (size_t)k;
	}
	return (ssize_t)got;
}

/*
 * What is wrong with a session file of `size` bytes whose first `have`
 * bytes are h (the header and, when `have` allows, the ids), checked in
 * this order: magic, room for the ids the header counts, the header
 * checksum (before any field is believed), format, size against the
 * header (ids, group value bytes x groups), groups within the ids.  0, or
 * -ST_E_FORMAT / -ST_E_CHECKSUM / -ST_E_VERSION with a short reason in
 * why ("header checksum mismatch", "size N, header says M", ...).
 */
static int file_problem(const uint8_t *h, size_t have, uint64_t size,
			char *why, size_t cap)
{
	uint32_t n_ids, n_groups, rows;
	uint64_t want;

	if (size < HDR_BYTES || have < HDR_BYTES || memcmp(h, k_magic, 8)) {
		snprintf(why, cap, "not a strata session file");
		return -ST_E_FORMAT;
	}
	n_ids = st_get_le32(h + 52);
	if (n_ids > KV_PROTO_MAX_IDS ||
	    size < HDR_BYTES + (uint64_t)n_ids * 4 ||
	    have < HDR_BYTES + (size_t)n_ids * 4) {
		snprintf(why, cap, "size %" PRIu64 ", header says at least "
			 "%" PRIu64, size, HDR_BYTES + (uint64_t)n_ids * 4);
		return -ST_E_FORMAT;
	}
	if (st_get_le64(h + SUM_OFF) != header_sum(h, h + HDR_BYTES, n_ids)) {
		snprintf(why, cap, "header checksum mismatch");
		return -ST_E_CHECKSUM;
	}
	if (st_get_le32(h + 8) != KV_SESSION_FORMAT) {
		snprintf(why, cap, "format %u, this kvd reads %u",
			 st_get_le32(h + 8), KV_SESSION_FORMAT);
		return -ST_E_VERSION;
	}
	n_groups = st_get_le32(h + 48);
	rows = st_get_le32(h + 44);
	want = HDR_BYTES + (uint64_t)n_ids * 4 +
	       st_get_le64(h + 120) * n_groups;
	if (size != want) {
		snprintf(why, cap, "size %" PRIu64 ", header says %" PRIu64,
			 size, want);
		return -ST_E_FORMAT;
	}
	if (n_groups == 0 || rows == 0 || (uint64_t)n_groups * rows > n_ids) {
		snprintf(why, cap, "header: %u page groups of %u rows for %u "
			 "token ids", n_groups, rows, n_ids);
		return -ST_E_FORMAT;
	}
	return 0;
}

/* Reads an opened session file whole (at most max bytes) into *ret
 * (malloc'd); closes fd. */
static int read_all(int fd, uint64_t size, size_t max, uint8_t **ret,
		    size_t *ret_len)
{
	uint8_t *b;
	ssize_t got;

	if (size > max) {
		close(fd);
		return -EFBIG;
	}
	b = malloc((size_t)size + 1);
	if (!b) {
		close(fd);
		return -ENOMEM;
	}
	got = read_up_to(fd, b, (size_t)size);
	close(fd);
	if (got < 0 || (uint64_t)got != size) {
		free(b);
		return got < 0 ? (int)got : -EIO;
	}
	*ret = b;
	*ret_len = (size_t)size;
	return 0;
}

/*
 * Reads the header and ids of the session file at path (opened as
 * open_file) and checks them (file_problem).  *ret_rows gets its rows.
 * 0, or an error with why: -ENOENT (none), open_file's, file_problem's.
 */
static int peek_file(const char *dir, const char *path, uint32_t *ret_rows,
		     char *model, uint64_t *ret_size, char *why, size_t cap)
{
	uint8_t h[HDR_BYTES], *b = NULL;
	uint64_t size = 0;
	size_t have;
	ssize_t got;
	int fd, r;

	*ret_rows = 0;
	r = open_file(dir, path, &fd, &size, why, cap);
	if (ret_size)
		*ret_size = size;
	if (r < 0)
		return r;
	got = read_up_to(fd, h, sizeof(h));
	have = got > 0 ? (size_t)got : 0;
	if (have == HDR_BYTES && !memcmp(h, k_magic, 8) &&
	    st_get_le32(h + 52) <= KV_PROTO_MAX_IDS &&
	    size >= HDR_BYTES + (uint64_t)st_get_le32(h + 52) * 4) {
		size_t n = HDR_BYTES + (size_t)st_get_le32(h + 52) * 4;

		b = malloc(n);
		if (!b) {
			close(fd);
			return -ENOMEM;
		}
		memcpy(b, h, HDR_BYTES);
		got = read_up_to(fd, b + HDR_BYTES, n - HDR_BYTES);
		have = got >= 0 ? HDR_BYTES + (size_t)got : HDR_BYTES;
	}
	close(fd);
	r = file_problem(b ? b : h, have, size, why, cap);
	if (r == 0) {
		*ret_rows = st_get_le32(h + 48) * st_get_le32(h + 44);
		if (model) {
			memcpy(model, h + MODEL_OFF, KV_SESSION_MODEL_BYTES);
			model[KV_SESSION_MODEL_BYTES] = 0;
			for (char *c = model; *c; c++)
				if (*c < 0x20 || *c == 0x7f)
					*c = '?';
		}
	}
	free(b);
	return r;
}

/* Checks header h (len bytes of file) against the ident and the pool; 0
 * or the error with diag naming what differs. */
static int check_header(const struct kv_pool *p, const char *name,
			const uint8_t *h, size_t len,
			const struct kv_session_ident *id,
			struct st_diag *diag)
{
	char model[KV_SESSION_MODEL_BYTES + 1], why[160];
	int r = file_problem(h, len, len, why, sizeof(why));

	if (r == -ST_E_VERSION)
		return st_diag_set(diag, r, "session '%s': %s", name, why);
	if (r < 0)
		return st_diag_set(diag, r, "session '%s': %s (corrupt file); "
				   "nothing loaded", name, why);
	memcpy(model, h + MODEL_OFF, KV_SESSION_MODEL_BYTES);
	model[KV_SESSION_MODEL_BYTES] = 0;
	if (strcmp(model, id->model))
		return st_diag_set(diag, -ST_E_CONFIG, "session '%s' is of "
				   "model '%s'; this instance serves '%s'",
				   name, model, id->model);
	if (st_get_le64(h + 24) != id->store_id)
		return st_diag_set(diag, -ST_E_CONFIG, "session '%s' was "
				   "computed from another store of '%s' "
				   "(store id %016" PRIx64 ", this instance's "
				   "%016" PRIx64 ": other weights or experts)",
				   name, model, st_get_le64(h + 24),
				   id->store_id);
	if (st_get_le32(h + 40) != id->kv_dtype)
		return st_diag_set(diag, -ST_E_CONFIG, "session '%s' has KV "
				   "dtype %s; this instance uses %s", name,
				   dtype_name(st_get_le32(h + 40)),
				   dtype_name(id->kv_dtype));
	if (st_get_le32(h + 44) != id->page_rows ||
	    st_get_le32(h + 44) != p->lay.page_rows)
		return st_diag_set(diag, -ST_E_CONFIG, "session '%s' has a "
				   "page size of %u rows; this instance uses "
				   "%u", name, st_get_le32(h + 44),
				   p->lay.page_rows);
	if (st_get_le64(h + 16) != id->model_id)
		return st_diag_set(diag, -ST_E_CONFIG, "session '%s': another "
				   "model id (%016" PRIx64 ", this instance's "
				   "%016" PRIx64 ")", name, st_get_le64(h + 16),
				   id->model_id);
	if (st_get_le32(h + 12) != p->lay.n_streams ||
	    st_get_le64(h + 32) != kv_pool_decl_hash(p))
		return st_diag_set(diag, -ST_E_CONFIG, "session '%s': another "
				   "KV stream declaration (%u streams, this "
				   "pool %u)", name, st_get_le32(h + 12),
				   p->lay.n_streams);
	if (st_get_le64(h + 120) != kv_group_value_len(p))
		return st_diag_set(diag, -ST_E_CONFIG, "session '%s': another "
				   "KV stream declaration (%" PRIu64 " bytes a "
				   "page group, this pool %zu)", name,
				   st_get_le64(h + 120), kv_group_value_len(p));
	return 0;
}

/* Places one verified value as an idle cached group (fresh pages). */
static int place(struct kv_pool *p, uint64_t key, const uint8_t *v,
		 uint32_t stamp, struct st_diag *diag)
{
	const uint32_t ns = p->lay.n_streams;
	const uint8_t *data = v + 40 + 16 * (size_t)ns;
	uint32_t pages[KV_MAX_STREAMS], k;
	int r = 0;

	if (ns > kv_pool_free_pages(p)) {
		r = kv_pool_make_room(p, ns, stamp, "loading a session", diag);
		if (r < 0)
			return r;
	}
	for (k = 0; k < ns; k++) {
		r = kv_page_alloc(p, k, &pages[k]);
		if (r < 0)
			goto undo;
	}
	for (uint32_t s = 0; s < ns; s++) {
		uint32_t sl = st_get_le32(v + 40 + 16 * (size_t)s);

		memcpy(kv_page_data(p, pages[s]), data, sl);
		data += sl;
	}
	r = kv_cache_insert(p, key, pages);
	if (r < 0)
		goto undo;
	/* our references go: the group stays cached, idle (or the pages are
	 * freed when the key was cached meanwhile, r == 0) */
	for (uint32_t s = 0; s < ns; s++)
		kv_page_unref(p, pages[s]);
	return r;
undo:
	for (uint32_t i = 0; i < k; i++)
		kv_page_unref(p, pages[i]);
	return r;
}

int kv_session_load(struct kv_pool *p, const char *dir, const char *name,
		    const struct kv_session_ident *id, uint32_t *ret_placed,
		    uint32_t *ret_rows, int32_t **ret_ids,
		    uint32_t *ret_n_ids, struct st_diag *diag)
{
	const size_t vl = kv_group_value_len(p);
	uint32_t n_groups, n_ids, placed = 0, stamp;
	uint64_t *keys = NULL;
	int32_t *ids = NULL;
	uint8_t *f = NULL;
	const uint8_t *vals;
	char path[4400], why[256] = "";
	uint64_t size = 0;
	size_t len = 0, max;
	int r, fd = -1;

	*ret_placed = *ret_rows = *ret_n_ids = 0;
	*ret_ids = NULL;
	r = path_of(dir, name, path, sizeof(path), diag);
	if (r < 0)
		return r;
	max = HDR_BYTES + (size_t)KV_PROTO_MAX_IDS * 4 +
	      vl * (size_t)p->lay.max_pages_per_seq;
	r = open_file(dir, path, &fd, &size, why, sizeof(why));
	if (r == 0) {
		r = read_all(fd, size, max, &f, &len);
		if (r < 0)
			snprintf(why, sizeof(why), "%s", st_strerror(r));
	}
	if (r == -ENOENT && p->remote) {
		/* not on this node's disk: another node may have saved it */
		char key[128];

		remote_key(name, key, sizeof(key));
		r = kv_remote_blob_get(p->remote, key, &f, &len);
		if (r == 1 && len > max) {
			free(f);
			f = NULL;
			return st_diag_set(diag, -ST_E_FORMAT, "session '%s' "
					   "in the remote KV tier: %zu bytes, "
					   "more than this pool's sessions "
					   "take", name, len);
		}
		if (r == 1)
			st_info("session '%s': read from the remote KV tier "
				"(%zu bytes)", name, len);
		else
			r = -ENOENT;
	}
	if (r == -ENOENT)
		return st_diag_set(diag, -ST_E_NOTFOUND, "session '%s' does "
				   "not exist (strata session ls)", name);
	if (r == -ENOTDIR) /* why names the directory */
		return st_diag_set(diag, r, "session '%s': %s", name, why);
	if (r < 0)
		return st_diag_set(diag, r, "session '%s': reading %s: %s",
				   name, path, why);
	r = check_header(p, name, f, len, id, diag);
	if (r < 0)
		goto out;
	n_groups = st_get_le32(f + 48);
	n_ids = st_get_le32(f + 52);
	ids = malloc(sizeof(int32_t) * n_ids);
	keys = malloc(sizeof(uint64_t) * n_groups);
	if (!ids || !keys) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n_ids; i++)
		ids[i] = (int32_t)st_get_le32(f + HDR_BYTES + 4 * (size_t)i);
	r = kv_prefix_keys(ids, p->lay.page_rows, id->model_id, n_groups,
			   keys);
	if (r < 0)
		goto out;
	vals = f + HDR_BYTES + (size_t)n_ids * 4;
	/* every group is checked before any is used */
	for (uint32_t g = 0; g < n_groups; g++) {
		const char *why = kv_group_value_check(p, keys[g],
						       vals + vl * g, vl);

		if (why) {
			r = st_diag_set(diag, -ST_E_CHECKSUM, "session '%s': "
					"page group %u of %u: %s (corrupt "
					"file); nothing loaded", name, g,
					n_groups, why);
			goto out;
		}
	}
	stamp = kv_mark_begin(p);
	for (uint32_t g = 0; g < n_groups; g++) {
		r = place(p, keys[g], vals + vl * g, stamp, diag);
		if (r < 0)
			goto out;
		placed += (uint32_t)r;
	}
	*ret_rows = n_groups * p->lay.page_rows;
	*ret_ids = ids;
	*ret_n_ids = n_ids;
	ids = NULL;
	r = 0;
out:
	*ret_placed = placed;
	free(ids);
	free(keys);
	free(f);
	return r;
}

static int info_cmp(const void *a, const void *b)
{
	return strcmp(((const struct kv_session_info *)a)->name,
		      ((const struct kv_session_info *)b)->name);
}

int kv_session_list(const char *dir, struct kv_session_info *ret,
		    uint32_t cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	uint32_t n = 0;

	if (!d)
		return errno == ENOENT ? 0 : -errno;
	while (n < cap && (e = readdir(d))) {
		size_t l = strlen(e->d_name), sl = strlen(KV_SESSION_SUFFIX);
		struct kv_session_info *it = &ret[n];
		char path[4400];
		int r;

		if (l <= sl || strcmp(e->d_name + l - sl, KV_SESSION_SUFFIX) ||
		    l - sl > KV_SESSION_NAME_BYTES)
			continue;
		memset(it, 0, sizeof(*it));
		memcpy(it->name, e->d_name, l - sl);
		if (!kv_session_name_ok(it->name, NULL))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		r = peek_file(dir, path, &it->n_rows, it->model,
			      &it->file_bytes, it->bad, sizeof(it->bad));
		if (r == -ENOENT)
			continue; /* removed meanwhile */
		if (r == -ENOMEM) {
			closedir(d);
			return r;
		}
		if (r == 0)
			it->bad[0] = 0;
		else if (!it->bad[0])
			snprintf(it->bad, sizeof(it->bad), "%s",
				 st_strerror(r));
		n++;
	}
	closedir(d);
	qsort(ret, n, sizeof(*ret), info_cmp);
	return (int)n;
}

int kv_session_remove(struct kv_remote *remote, const char *dir,
		      const char *name, struct st_diag *diag)
{
	char path[4400];
	int found = 0, r = path_of(dir, name, path, sizeof(path), diag);
	struct stat st;

	if (r < 0)
		return r;
	if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
		return st_diag_set(diag, S_ISLNK(st.st_mode) ? -ELOOP : -EPERM,
				   "removing session '%s': %s is %s, not a "
				   "session file kvd wrote; kvd leaves it "
				   "(remove it by hand)", name, path,
				   S_ISLNK(st.st_mode) ? "a symbolic link" :
				   "not a regular file");
	if (unlink(path) < 0) {
		r = -errno;
		if (r != -ENOENT)
			return st_diag_set(diag, r, "removing session '%s': "
					   "%s", name, st_strerror(r));
	} else {
		found = 1;
	}
	if (remote) {
		char key[128];
		int d;

		remote_key(name, key, sizeof(key));
		d = kv_remote_blob_del(remote, key);
		if (d < 0)
			return st_diag_set(diag, d, "session '%s': %s; the "
					   "remote KV tier could not remove "
					   "its copy (%s)", name, found ?
					   "removed here" : "not here",
					   st_strerror(d));
		found |= d;
	}
	if (!found)
		return st_diag_set(diag, -ST_E_NOTFOUND, "session '%s' does "
				   "not exist", name);
	return 0;
}
