/* st_shm.c — see st_shm.h. */
#include "st_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "st_util.h"

int st_shm_name(const char *instance, const char *pool, char *buf, size_t len)
{
	size_t n = strlen(instance);

	if (n == 0 || n > 48)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		char c = instance[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return -EINVAL;
	}
	if (snprintf(buf, len, "/strata.%s.%s", instance, pool) >= (int)len)
		return -ENAMETOOLONG;
	return 0;
}

/* -EPERM unless fd is a regular file of our effective uid with no group or
 * other access (st_shm.h "Trust"); path names it in the message. */
static int check_ours(int fd, const char *path, struct st_diag *diag)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return st_diag_set(diag, -errno, "%s: %s", path,
				   strerror(errno));
	if (S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
	    !(st.st_mode & 077))
		return 0;
	return st_diag_set(diag, -EPERM,
			   "%s is not this user's private file (%s of uid "
			   "%u, mode %04o; strata makes its own 0600, as uid "
			   "%u) and is left alone: another user may have made "
			   "it to read or change what strata keeps there.  "
			   "Check `ls -l %s`, remove it as its owner or root, "
			   "or use another --instance", path,
			   S_ISREG(st.st_mode) ? "file" : "not a regular file",
			   (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
			   (unsigned)geteuid(), path);
}

static uint64_t header_checksum(const struct st_shm_header *h)
{
	struct st_shm_header copy;

	memcpy(&copy, h, sizeof(copy));
	atomic_store_explicit(&copy.owner_pid, 0, memory_order_relaxed);
	atomic_store_explicit(&copy.epoch, 0, memory_order_relaxed);
	return st_xxh3((const uint8_t *)&copy + 8,
		       offsetof(struct st_shm_header, checksum) - 8);
}

int st_shm_create(struct st_shm *shm, const char *instance, const char *kind,
		  uint32_t layout_version, uint64_t layout_hash, size_t size)
{
	struct st_shm_header *h;
	void *base;
	int fd, r;

	memset(shm, 0, sizeof(*shm));
	r = st_shm_name(instance, kind, shm->name, sizeof(shm->name));
	if (r < 0)
		return r;
	size = (size_t)st_shm_round(size);
	fd = shm_open(shm->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0) {
		r = -errno;
		close(fd);
		shm_unlink(shm->name);
		return r;
	}
	base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	r = -errno;
	close(fd);
	if (base == MAP_FAILED) {
		shm_unlink(shm->name);
		return r;
	}
	h = base;
	h->layout_version = layout_version;
	h->header_bytes = ST_SHM_HEADER_BYTES;
	snprintf(h->kind, sizeof(h->kind), "%s", kind);
	snprintf(h->instance, sizeof(h->instance), "%s", instance);
	atomic_store(&h->owner_pid, (int32_t)getpid());
	atomic_store(&h->epoch, 1);
	h->total_bytes = size;
	h->layout_hash = layout_hash;
	h->pool_id = st_random_id();
	h->checksum = header_checksum(h);
	atomic_store_explicit(&h->magic, ST_SHM_MAGIC, memory_order_release);
	shm->base = base;
	shm->size = size;
	shm->owner = 1;
	return 0;
}

int st_shm_attach(struct st_shm *shm, const char *instance, const char *kind,
		  uint32_t layout_version, uint64_t layout_hash,
		  struct st_diag *diag)
{
	struct st_shm_header *h;
	struct stat st;
	void *base;
	int fd, r;

	memset(shm, 0, sizeof(*shm));
	r = st_shm_name(instance, kind, shm->name, sizeof(shm->name));
	if (r < 0)
		return r;
	fd = shm_open(shm->name, O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	{
		char path[160];

		snprintf(path, sizeof(path), "/dev/shm%s", shm->name);
		r = check_ours(fd, path, diag);
	}
	if (r == 0 && fstat(fd, &st) < 0)
		r = -errno;
	if (r < 0) {
		close(fd);
		return r;
	}
	if ((size_t)st.st_size < ST_SHM_HEADER_BYTES) {
		close(fd);
		return st_diag_set(diag, -ST_E_BADMAGIC,
				   "shm %s: %lld bytes, smaller than a header",
				   shm->name, (long long)st.st_size);
	}
	base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
		    MAP_SHARED, fd, 0);
	r = -errno;
	close(fd);
	if (base == MAP_FAILED)
		return r;
	h = base;
	r = 0;
	if (atomic_load_explicit(&h->magic, memory_order_acquire) !=
	    ST_SHM_MAGIC)
		r = st_diag_set(diag, -ST_E_BADMAGIC,
				"shm %s: bad magic (not a strata segment, or "
				"its creator died before finishing it)",
				shm->name);
	else if (h->layout_version != layout_version)
		r = st_diag_set(diag, -ST_E_VERSION,
				"shm %s: layout version %u, this build uses %u; "
				"stop the old daemons (strata down) first",
				shm->name, h->layout_version, layout_version);
	else if (strncmp(h->kind, kind, sizeof(h->kind)) ||
		 h->header_bytes != ST_SHM_HEADER_BYTES ||
		 h->total_bytes != (uint64_t)st.st_size)
		r = st_diag_set(diag, -ST_E_FORMAT,
				"shm %s: header kind/size does not match",
				shm->name);
	else if (h->checksum != header_checksum(h))
		r = st_diag_set(diag, -ST_E_FORMAT,
				"shm %s: header checksum mismatch", shm->name);
	else if (layout_hash && h->layout_hash != layout_hash)
		r = st_diag_set(diag, -ST_E_FORMAT,
				"shm %s: pool geometry differs from the one "
				"expected", shm->name);
	if (r < 0) {
		munmap(base, (size_t)st.st_size);
		return r;
	}
	shm->base = base;
	shm->size = (size_t)st.st_size;
	return 0;
}

int st_shm_remove_stale(const char *instance, const char *kind,
			struct st_diag *diag)
{
	struct st_shm_header h;
	char name[128], path[160];
	int fd, r;

	r = st_shm_name(instance, kind, name, sizeof(name));
	if (r < 0)
		return st_diag_set(diag, r, "bad instance name '%s'", instance);
	snprintf(path, sizeof(path), "/dev/shm%s", name);
	fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0 && errno == ENOENT)
		return 0;
	if (fd >= 0) {
		ssize_t got;

		r = check_ours(fd, path, diag);
		got = r < 0 ? 0 : pread(fd, &h, sizeof(h), 0);
		close(fd);
		if (r < 0)
			return r;
		/* a live owner's segment is never removed: an older daemon
		 * (another layout) may still serve it */
		if (got == (ssize_t)sizeof(h) &&
		    atomic_load(&h.magic) == ST_SHM_MAGIC &&
		    atomic_load(&h.owner_pid) != getpid() &&
		    st_pid_alive(atomic_load(&h.owner_pid)))
			return st_diag_set(diag, -EBUSY,
					   "%s is owned by live process %d; "
					   "stop it first", path,
					   atomic_load(&h.owner_pid));
	}
	/* unreadable by us (fd < 0: e.g. mode 000 of ours): unlink decides */
	if (shm_unlink(name) < 0 && errno != ENOENT)
		return st_diag_set(diag, -errno,
				   "cannot remove the unusable %s (%s); remove "
				   "it by hand (rm %s) or use another "
				   "--instance",
				   path, strerror(errno), path);
	return 1;
}

int st_shm_open_owner(struct st_shm *shm, const char *instance,
		      const char *kind, uint32_t layout_version,
		      uint64_t layout_hash, size_t size, struct st_diag *diag)
{
	struct st_diag local = { "" };
	int r = st_shm_attach(shm, instance, kind, layout_version, layout_hash,
			      &local);

	if (r == -EPERM)
		return st_diag_set(diag, r, "%s", local.msg);
	if (r == 0) {
		struct st_shm_header *h = st_shm_hdr(shm);
		int32_t pid = atomic_load(&h->owner_pid);

		if (pid != getpid() && st_pid_alive(pid)) {
			st_shm_detach(shm);
			return st_diag_set(diag, -EBUSY,
					   "shm %s is owned by live process %d",
					   shm->name, pid);
		}
		if (shm->size == (size_t)st_shm_round(size)) {
			atomic_store(&h->owner_pid, (int32_t)getpid());
			atomic_fetch_add(&h->epoch, 1);
			shm->owner = 1;
			return 1;
		}
		st_shm_detach(shm);
	}
	if (r != -ENOENT) {
		r = st_shm_remove_stale(instance, kind, diag);
		if (r < 0)
			return r;
	}
	r = st_shm_create(shm, instance, kind, layout_version, layout_hash,
			  size);
	return r < 0 ? st_diag_set(diag, r, "shm_open %s: %s", shm->name,
				   st_strerror(r))
		     : 0;
}

/* The name of the lock of daemon for instance. */
static int lock_name(const char *instance, const char *daemon, char *buf,
		     size_t len)
{
	char seg[128];
	int r = st_shm_name(instance, daemon, seg, sizeof(seg));

	if (r < 0)
		return r;
	/* "/strata-lock.<instance>.<daemon>": not "strata.<instance>.*",
	 * which names segments (strata down removes those of dead owners) */
	if (snprintf(buf, len, "/strata-lock%s", seg + strlen("/strata")) >=
	    (int)len)
		return -ENAMETOOLONG;
	return 0;
}

int st_shm_lock(const char *instance, const char *daemon, int *ret_fd,
		struct st_diag *diag)
{
	char name[160], path[180];
	int r;

	*ret_fd = -1;
	r = lock_name(instance, daemon, name, sizeof(name));
	if (r < 0)
		return st_diag_set(diag, r, "bad instance name '%s'", instance);
	snprintf(path, sizeof(path), "/dev/shm%s", name);
	for (;;) {
		struct stat a, b;
		int fd = shm_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);

		if (fd < 0)
			return st_diag_set(diag, -errno, "lock %s: %s", path,
					   strerror(errno));
		r = check_ours(fd, path, diag);
		if (r < 0) {
			close(fd);
			return r;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			r = -errno;
			close(fd);
			if (r == -EWOULDBLOCK)
				return st_diag_set(
					diag, -EBUSY, "another %s is serving "
					"instance '%s' (it holds %s); stop it "
					"first (strata down) or use another "
					"--instance", daemon, instance, path);
			return st_diag_set(diag, r, "lock %s: %s", path,
					   strerror(-r));
		}
		/* a holder that stopped removed the file we opened: the
		 * lock that counts is the one on the file now named so */
		if (fstat(fd, &a) == 0 && stat(path, &b) == 0 &&
		    a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
			*ret_fd = fd;
			return 0;
		}
		close(fd);
	}
}

void st_shm_unlock(const char *instance, const char *daemon, int fd)
{
	char name[160];

	if (fd < 0)
		return;
	if (lock_name(instance, daemon, name, sizeof(name)) == 0)
		shm_unlink(name); /* still ours: we hold the lock */
	close(fd);
}

void st_shm_detach(struct st_shm *shm)
{
	if (shm && shm->base) {
		munmap(shm->base, shm->size);
		shm->base = NULL;
	}
}

void st_shm_destroy(struct st_shm *shm)
{
	if (!shm)
		return;
	st_shm_detach(shm);
	if (shm->name[0])
		shm_unlink(shm->name);
	shm->owner = 0;
}
