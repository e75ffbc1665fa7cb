/*
 * st_shm.h — POSIX shared-memory segments with a validated header
 * (DESIGN.md section 3).
 *
 * Name: "/strata.<instance>.<pool>".  Mode 0600.  The segment starts with
 * struct st_shm_header (fixed offsets, 256 bytes); the owner writes every
 * field, then the checksum, and the magic LAST (with a release store), so an
 * attacher that sees the magic sees a complete header.  Attachers check
 * magic, layout version, kind and size before anything else.
 *
 * Ownership: the creating daemon owns the segment (st_shm_create /
 * st_shm_adopt) and unlinks it on clean shutdown (st_shm_destroy).  A
 * segment left by a killed owner is adopted by the next owner (PITFALLS P17):
 * st_shm_open_owner() tells which case applies.  Only one daemon of a kind
 * per instance may own segments: it holds st_shm_lock() for its life.
 *
 * Identity: pool_id, drawn at random by st_shm_create, names one creation
 * of a segment and is kept by adoption; epoch counts the adoptions.  A
 * reader compares both with what the owner reports: a segment removed and
 * made again under the same name has another pool_id even when its epoch
 * is the same (both 1).
 *
 * Trust: a segment (or lock file) that is not a regular file of this
 * process's effective uid with no group/other access is never attached,
 * adopted or removed (-EPERM, saying what to do): another local user could
 * have made it to read or write what the daemons keep there.
 */
#ifndef ST_SHM_H
#define ST_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

#define ST_SHM_MAGIC 0x314d48534154535fULL /* "_STASHM1" */
#define ST_SHM_HEADER_BYTES 256
#define ST_SHM_ALIGN (2u * 1024 * 1024) /* large regions aligned to 2 MiB */
#define ST_SHM_PAGE 4096u
/* Regions of at least this many bytes are 2 MiB aligned (huge pages pay
 * off); smaller ones only page aligned, so a small pool is not dominated
 * by padding and stays within its budget. */
#define ST_SHM_HUGE_MIN (64ull * 1024 * 1024)

/* Alignment for a data region of `bytes`: ST_SHM_ALIGN or ST_SHM_PAGE. */
static inline uint64_t st_shm_region_align(uint64_t bytes)
{
	return bytes >= ST_SHM_HUGE_MIN ? ST_SHM_ALIGN : ST_SHM_PAGE;
}

/* The size a segment of `size` bytes really gets (what st_shm_create
 * makes): rounded up to st_shm_region_align(size). */
static inline uint64_t st_shm_round(uint64_t size)
{
	uint64_t a = st_shm_region_align(size);

	return (size + a - 1) / a * a;
}

struct st_shm_header {
	_Atomic uint64_t magic;      /* written last by the creator */
	uint32_t layout_version;     /* of the pool-specific layout after it */
	uint32_t header_bytes;       /* ST_SHM_HEADER_BYTES */
	char kind[16];               /* "experts", "kv" */
	char instance[64];
	_Atomic int32_t owner_pid;
	uint32_t reserved0;
	_Atomic uint64_t epoch;      /* bumped on every (re)creation / adoption */
	uint64_t total_bytes;        /* size of the whole segment */
	uint64_t layout_hash;        /* pool-specific: hash of its geometry */
	uint64_t pool_id;            /* st_random_id() at creation, != 0 */
	uint64_t checksum;           /* XXH3 of bytes [8, offsetof(checksum))
				      * with owner_pid and epoch taken as 0 */
	uint8_t pad[ST_SHM_HEADER_BYTES - 144];
};

_Static_assert(sizeof(struct st_shm_header) == ST_SHM_HEADER_BYTES,
	       "shm header must be 256 bytes");
_Static_assert(offsetof(struct st_shm_header, owner_pid) == 96 &&
	       offsetof(struct st_shm_header, epoch) == 104 &&
	       offsetof(struct st_shm_header, pool_id) == 128,
	       "tests and tools read these offsets");

struct st_shm {
	char name[128];              /* "/strata.<instance>.<pool>" */
	void *base;                  /* mapping (borrowed by users) */
	size_t size;
	int owner;                   /* 1 if this process created/adopted it */
};

/* Builds the segment name into buf.  0 or -ENAMETOOLONG / -EINVAL (instance
 * must be [A-Za-z0-9_-]{1,48}). */
int st_shm_name(const char *instance, const char *pool, char *buf, size_t len);

/*
 * Creates a new segment of `size` bytes (rounded up by st_shm_round) with
 * O_EXCL, maps it read-write, zero-filled, and writes the header (kind,
 * instance, layout_version, layout_hash, owner_pid = getpid(), epoch = 1,
 * a fresh pool_id) with the magic last.  -EEXIST if the name exists.
 */
int st_shm_create(struct st_shm *shm, const char *instance, const char *kind,
		  uint32_t layout_version, uint64_t layout_hash, size_t size);

/*
 * Attaches to an existing segment read-write and validates its header:
 * -ENOENT, -EPERM (not ours: another uid, or group/other access; see the
 * top of this file), -ST_E_BADMAGIC (not a strata segment or not
 * finished), -ST_E_VERSION (layout_version differs), -ST_E_FORMAT (kind,
 * size or checksum wrong, message in diag).  layout_hash 0 skips that
 * check.
 */
int st_shm_attach(struct st_shm *shm, const char *instance, const char *kind,
		  uint32_t layout_version, uint64_t layout_hash,
		  struct st_diag *diag);

/*
 * For an owner starting up (holding st_shm_lock): attaches to a segment
 * left by a dead owner and takes it over (owner_pid = getpid(), epoch + 1,
 * pool_id kept) when its header validates with the same layout; returns 1
 * when adopted, 0 when a fresh segment was created (none existed, or the
 * old one was invalid/different and was removed), -EBUSY when the recorded
 * owner is still alive (never removed), -EPERM for a segment that is not
 * ours (never adopted nor removed), or another negative code (a failed
 * removal included), message in diag.
 */
int st_shm_open_owner(struct st_shm *shm, const char *instance,
		      const char *kind, uint32_t layout_version,
		      uint64_t layout_hash, size_t size, struct st_diag *diag);

/*
 * Removes /strata.<instance>.<kind> when it cannot be used (the caller
 * found it invalid or of another layout), unless it is not ours (-EPERM)
 * or its header names a live owner (-EBUSY: an older daemon still using
 * it).  1 when removed, 0 when there was nothing, or a negative code with
 * the message in diag (a failed shm_unlink included: -errno, naming the
 * file to remove by hand).
 */
int st_shm_remove_stale(const char *instance, const char *kind,
			struct st_diag *diag);

/*
 * Takes the exclusive lock of `daemon` ("kvd", "expertd") for instance:
 * flock(2) on /dev/shm/strata-lock.<instance>.<daemon> (made 0600 when
 * absent), held until st_shm_unlock or the process's death, so that two
 * daemons of one kind never check and adopt the same segments at once.
 * *ret_fd gets the lock's descriptor.  -EBUSY when another process holds
 * it, -EPERM when the file is not ours, other negative codes; message in
 * diag saying what to do.
 */
int st_shm_lock(const char *instance, const char *daemon, int *ret_fd,
		struct st_diag *diag);

/* Releases a lock of st_shm_lock (fd < 0: nothing), removing its file
 * first so that a clean stop leaves nothing in /dev/shm; a successor that
 * had opened the removed file notices and takes a fresh one. */
void st_shm_unlock(const char *instance, const char *daemon, int fd);

/*
 * For a segment shared by peers (no owner: the I/O queue, the memory
 * ledger): attaches to /strata.<instance>.<kind>, making it (size bytes,
 * zero-filled, layout_hash 1) when absent.  A segment without its magic
 * may be one being made: waited for a while, then removed as left by a
 * creator that died; one of another layout or too small is removed (when
 * no live process owns it) and made anew.  Returns 1 when this call made
 * it, 0 when it attached, or a negative code with diag naming `what`
 * ("I/O queue").
 */
int st_shm_attach_or_make(struct st_shm *shm, const char *instance,
			  const char *kind, uint32_t layout_version,
			  size_t size, const char *what, struct st_diag *diag);

/*
 * flock(2) on the name of attached segment shm, so that a peer taking its
 * place and a last close's unlink never interleave.  Returns the locked
 * descriptor (release with st_shm_name_unlock), -ENOENT when the name is
 * gone or now names another segment (pool_id), -EBUSY when nonblock and
 * another process holds it, or -errno.
 */
int st_shm_name_lock(const struct st_shm *shm, int nonblock);

/* Releases a lock of st_shm_name_lock (fd < 0: nothing). */
void st_shm_name_unlock(int fd);

/* Unmaps (does not unlink).  Safe on a zeroed struct. */
void st_shm_detach(struct st_shm *shm);

/* Unmaps and unlinks (owner's clean shutdown). */
void st_shm_destroy(struct st_shm *shm);

/* Header at the start of the mapping. */
static inline struct st_shm_header *st_shm_hdr(const struct st_shm *shm)
{
	return (struct st_shm_header *)shm->base;
}

#endif
