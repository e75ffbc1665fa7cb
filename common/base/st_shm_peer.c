/*
 * st_shm_peer.c — segments shared by peers rather than owned by one daemon
 * (the I/O queue, the memory ledger): attach-or-make and the name lock
 * (st_shm.h).
 */
#include "st_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include "st_util.h"

int st_shm_attach_or_make(struct st_shm *shm, const char *instance,
			  const char *kind, uint32_t layout_version,
			  size_t size, const char *what, struct st_diag *diag)
{
	for (int tries = 0; tries < 200; tries++) {
		struct st_diag local = { "" };
		int r = st_shm_attach(shm, instance, kind, layout_version, 0,
				      &local);

		if (r == 0 && shm->size >= size)
			return 0;
		if (r == 0) {
			st_shm_detach(shm);
			r = -ST_E_FORMAT;
		}
		if (r == -ENOENT) {
			r = st_shm_create(shm, instance, kind, layout_version, 1,
					  size);
			if (r == 0)
				return 1;
			if (r == -EEXIST)
				continue; /* another daemon made it first */
			return st_diag_set(diag, r, "cannot make the %s "
					   "segment /dev/shm/strata.%s.%s: %s",
					   what, instance, kind,
					   st_strerror(r));
		}
		if (r == -ST_E_BADMAGIC && tries < 20) {
			st_sleep_ns(1000000ull); /* its creator may be busy */
			continue;
		}
		if (r == -ST_E_BADMAGIC || r == -ST_E_VERSION ||
		    r == -ST_E_FORMAT) {
			r = st_shm_remove_stale(instance, kind, diag);
			if (r < 0)
				return r;
			continue;
		}
		return st_diag_set(diag, r, "%s", local.msg[0] ? local.msg :
				   st_strerror(r));
	}
	return st_diag_set(diag, -EAGAIN, "the %s segment of instance '%s' "
			   "keeps changing; try again", what, instance);
}

int st_shm_name_lock(const struct st_shm *shm, int nonblock)
{
	struct st_shm_header h;
	int fd = shm_open(shm->name, O_RDWR | O_CLOEXEC, 0600);

	if (fd < 0)
		return -errno;
	if (flock(fd, nonblock ? LOCK_EX | LOCK_NB : LOCK_EX) < 0) {
		int e = errno;

		close(fd);
		return e == EWOULDBLOCK ? -EBUSY : -e;
	}
	if (pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
	    h.pool_id != st_shm_hdr(shm)->pool_id) {
		close(fd);
		return -ENOENT;
	}
	return fd;
}

void st_shm_name_unlock(int fd)
{
	if (fd < 0)
		return;
	flock(fd, LOCK_UN);
	close(fd);
}
