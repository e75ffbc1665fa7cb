/*
 * es_convert_out.c — where the store writer writes: the temporary output
 * directory beside OUT (and what dead converts left there), whole-file
 * writes with fsync, the copied files (config, tokenizer), the manifest,
 * and phase 3, the atomic publish.
 */
#include "es_convert_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "st_log.h"

/* --- output directory ---------------------------------------------------- */

/* Is `name` "<base><suffix><digits>"?  Returns the number or -1. */
static long leftover_pid(const char *name, const char *base,
			 const char *suffix)
{
	size_t bl = strlen(base), sl = strlen(suffix);
	char *end;
	long pid;

	if (strncmp(name, base, bl) || strncmp(name + bl, suffix, sl))
		return -1;
	name += bl + sl;
	if (*name < '0' || *name > '9')
		return -1;
	pid = strtol(name, &end, 10);
	return *end || pid <= 0 ? -1 : pid;
}

/* Removes OUT.tmp-<pid> / OUT.old-<pid> left by converts that died (their
 * pid is gone: killed with SIGKILL, crashed), saying so in the log (warn:
 * the space was held until now); a live convert's directory is left
 * alone. */
static void remove_leftovers(struct conv *c)
{
	DIR *d = opendir(c->parent);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d))) {
		long pid = leftover_pid(de->d_name, c->base, ".tmp-");
		char path[8400];

		if (pid < 0)
			pid = leftover_pid(de->d_name, c->base, ".old-");
		if (pid < 0 || (pid != getpid() && st_pid_alive((int)pid)))
			continue;
		snprintf(path, sizeof(path), "%s/%s", c->parent, de->d_name);
		if (pid != getpid())
			st_warn("convert: removing %s, left by a convert that "
				"died (pid %ld)", path, pid);
		st_rm_rf(path);
	}
	closedir(d);
}

/* An existing directory we may replace under force: empty, or a store. */
static int replaceable(const char *dir)
{
	char path[4200];
	DIR *d;
	struct dirent *de;
	int empty = 1;

	snprintf(path, sizeof(path), "%s/%s", dir, ST_STORE_MANIFEST);
	if (st_path_exists(path))
		return 1;
	d = opendir(dir);
	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = 0;
	closedir(d);
	return empty;
}

int es_cv_prepare_out(struct conv *c, const char *out_dir, int *ret_exists)
{
	size_t n = strlen(out_dir);
	struct stat st;
	char *slash;

	while (n > 1 && out_dir[n - 1] == '/')
		n--;
	if (n == 0 || n >= sizeof(c->out) - 32)
		return st_diag_set(c->diag, -EINVAL, "output directory \"%s\": "
				   "empty or too long", out_dir);
	memcpy(c->out, out_dir, n);
	c->out[n] = 0;
	slash = strrchr(c->out, '/');
	if (!slash) {
		snprintf(c->parent, sizeof(c->parent), ".");
		c->base = c->out;
	} else {
		size_t pl = slash == c->out ? 1 : (size_t)(slash - c->out);

		memcpy(c->parent, c->out, pl);
		c->parent[pl] = 0;
		c->base = slash + 1;
	}
	if (!*c->base || !strcmp(c->base, ".") || !strcmp(c->base, ".."))
		return st_diag_set(c->diag, -EINVAL, "output directory \"%s\": "
				   "name a new directory", out_dir);
	if (stat(c->parent, &st) < 0)
		return st_diag_set(c->diag, -errno, "output directory %s: parent "
				   "%s: %s", c->out, c->parent, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return st_diag_set(c->diag, -ENOTDIR, "output directory %s: "
				   "parent %s is not a directory", c->out,
				   c->parent);
	remove_leftovers(c);
	*ret_exists = lstat(c->out, &st) == 0;
	if (*ret_exists) {
		if (!c->o.force)
			return st_diag_set(c->diag, -EEXIST,
					   "output directory %s exists; pass "
					   "--force to replace it", c->out);
		if (!S_ISDIR(st.st_mode) || !replaceable(c->out))
			return st_diag_set(c->diag, -EEXIST,
					   "output directory %s exists and is not "
					   "a strata store; refusing to replace it",
					   c->out);
	}
	snprintf(c->tmp, sizeof(c->tmp), "%s.tmp-%d", c->out, (int)getpid());
	if (mkdir(c->tmp, 0755) < 0)
		return st_diag_set(c->diag, -errno, "cannot create %s: %s", c->tmp,
				   strerror(errno));
	return 0;
}

/* --- writing helpers ----------------------------------------------------- */

int es_cv_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int es_cv_create_out_file(struct conv *c, const char *name, int *ret_fd)
{
	char path[4400];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", c->tmp, name);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return st_diag_set(c->diag, -errno, "cannot create %s: %s", path,
				   strerror(errno));
	*ret_fd = fd;
	return 0;
}

int es_cv_finish_out_file(struct conv *c, int fd, const char *name)
{
	int r = 0;

	if (fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	if (r)
		return st_diag_set(c->diag, r, "%s/%s: %s", c->tmp, name,
				   strerror(-r));
	return 0;
}

int es_cv_write_error(struct conv *c, int r, const char *name)
{
	return st_diag_set(c->diag, r, "writing %s/%s: %s", c->tmp, name,
			   strerror(-r));
}

char *es_cv_hex64(uint64_t x, char buf[17])
{
	snprintf(buf, 17, "%016" PRIx64, x);
	return buf;
}

int es_cv_jset(json_t *o, const char *key, json_t *v)
{
	if (!v)
		return -ENOMEM;
	return json_object_set_new(o, key, v) ? -ENOMEM : 0;
}

int es_cv_jappend(json_t *a, json_t *v)
{
	if (!v)
		return -ENOMEM;
	return json_array_append_new(a, v) ? -ENOMEM : 0;
}

int es_cv_jset_hex(json_t *o, const char *key, uint64_t x)
{
	char h[17];

	return es_cv_jset(o, key, json_string(es_cv_hex64(x, h)));
}

int es_cv_jset_int(json_t *o, const char *key, uint64_t x)
{
	return es_cv_jset(o, key, json_integer((json_int_t)x));
}

/* --- phase 2: copied files and the manifest ------------------------------ */

static int write_whole(struct conv *c, const char *name, const void *buf,
		       size_t len)
{
	int fd, r;

	if ((r = es_cv_create_out_file(c, name, &fd)))
		return r;
	r = es_cv_pwrite_full(fd, buf, len, 0);
	if (r) {
		close(fd);
		return es_cv_write_error(c, r, name);
	}
	return es_cv_finish_out_file(c, fd, name);
}

int es_cv_copy_files(struct conv *c, json_t *arr)
{
	for (size_t i = 0; i < ES_CV_N_COPIED; i++) {
		const char *name = es_cv_copied_files[i].name;
		char path[4200];
		char *buf = NULL;
		size_t len;
		json_t *o;
		int r;

		if (!c->have_copied[i])
			continue;
		if (!strcmp(name, "config.json")) {
			/* exactly the text the config was parsed from */
			buf = c->config_text;
			len = c->config_len;
		} else {
			snprintf(path, sizeof(path), "%s/%s", c->model_dir, name);
			r = st_read_file(path, &buf, &len);
			if (r)
				return st_diag_set(c->diag, r, "%s: %s", path,
						   strerror(-r));
		}
		r = write_whole(c, name, buf, len);
		if (!r && !(r = es_cv_jappend(arr, (o = json_object()))))
			if (!(r = es_cv_jset(o, "name", json_string(name))) &&
			    !(r = es_cv_jset_int(o, "bytes", len)))
				r = es_cv_jset_hex(o, "xxh3", st_xxh3(buf, len));
		if (buf != c->config_text)
			free(buf);
		if (r)
			return r == -ENOMEM ? st_diag_set(c->diag, r, "out of "
							  "memory") : r;
		if ((r = es_cv_progress(c, len)))
			return r;
	}
	return 0;
}

int es_cv_manifest_head(struct conv *c)
{
	json_t *m = c->manifest, *src = json_object(), *sf = json_array();
	int r;

	if (!src || !sf) {
		json_decref(src);
		json_decref(sf);
		return -ENOMEM;
	}
	r = es_cv_jset(src, "files", sf);
	for (int i = 0; i < c->ck->n_files && !r; i++) {
		json_t *o = json_object();

		if (!(r = es_cv_jappend(sf, o)) &&
		    !(r = es_cv_jset(o, "name", json_string(c->ck->file_names[i]))))
			r = es_cv_jset_int(o, "bytes", c->ck->file_sizes[i]);
	}
	if (r) {
		json_decref(src);
		return r;
	}
	if ((r = es_cv_jset(m, "format", json_string(ST_STORE_FORMAT))) ||
	    (r = es_cv_jset_int(m, "version", ST_STORE_VERSION)) ||
	    (r = es_cv_jset(m, "writer", json_string("strata " ST_VERSION)))) {
		json_decref(src);
		return r;
	}
	if (es_cv_jset(m, "config", json_stringn(c->config_text, c->config_len))) {
		json_decref(src);
		return st_diag_set(c->diag, -ST_E_FORMAT, "%s/config.json: not "
				   "valid UTF-8 (or out of memory)",
				   c->model_dir);
	}
	if ((r = es_cv_jset(m, "source", src)))
		return r;
	return es_cv_jset(m, "files", json_array());
}

int es_cv_write_manifest(struct conv *c)
{
	char *text = json_dumps(c->manifest, JSON_INDENT(1) |
					      JSON_PRESERVE_ORDER |
					      JSON_ENSURE_ASCII);
	size_t len;
	int r;

	if (!text)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	len = strlen(text);
	text[len] = '\n'; /* json_dumps leaves the NUL there: replace it */
	r = write_whole(c, ST_STORE_MANIFEST, text, len + 1);
	free(text);
	return r;
}

int es_cv_fsync_dir(struct conv *c, const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return st_diag_set(c->diag, -errno, "%s: %s", dir,
				   strerror(errno));
	if (fsync(fd) < 0)
		r = st_diag_set(c->diag, -errno, "fsync %s: %s", dir,
				strerror(errno));
	close(fd);
	return r;
}

/* --- phase 3: publish ---------------------------------------------------- */

int es_cv_publish(struct conv *c, int exists)
{
	char old[4200];

	if (!exists) {
		if (renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->out,
			      RENAME_NOREPLACE) == 0)
			return es_cv_fsync_dir(c, c->parent);
		if (errno == EEXIST || errno == ENOTEMPTY)
			return st_diag_set(c->diag, -EEXIST, "output directory %s "
					   "appeared during the conversion; not "
					   "replacing it", c->out);
		if (errno != EINVAL && errno != ENOSYS)
			return st_diag_set(c->diag, -errno, "rename %s -> %s: %s",
					   c->tmp, c->out, strerror(errno));
		if (rename(c->tmp, c->out) < 0)
			return st_diag_set(c->diag, -errno, "rename %s -> %s: %s",
					   c->tmp, c->out, strerror(errno));
		return es_cv_fsync_dir(c, c->parent);
	}
	/* force: swap the new store in atomically; the old one ends up in
	 * tmp and is removed with it. */
	if (renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->out, RENAME_EXCHANGE) == 0)
		return es_cv_fsync_dir(c, c->parent);
	if (errno != EINVAL && errno != ENOSYS)
		return st_diag_set(c->diag, -errno, "exchange %s and %s: %s",
				   c->tmp, c->out, strerror(errno));
	/* no RENAME_EXCHANGE on this file system: move the old one aside */
	snprintf(old, sizeof(old), "%s.old-%d", c->out, (int)getpid());
	if (rename(c->out, old) < 0)
		return st_diag_set(c->diag, -errno, "rename %s -> %s: %s", c->out,
				   old, strerror(errno));
	if (rename(c->tmp, c->out) < 0) {
		int e = errno;

		rename(old, c->out);
		return st_diag_set(c->diag, -e, "rename %s -> %s: %s", c->tmp,
				   c->out, strerror(e));
	}
	st_rm_rf(old);
	return es_cv_fsync_dir(c, c->parent);
}
