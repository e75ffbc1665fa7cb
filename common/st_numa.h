/*
 * st_numa.h — NUMA placement of a daemon and its shared-memory segments
 * (DESIGN.md section 3: "bound to a NUMA node with libnuma (mbind)").
 *
 * The one door to libnuma.  A daemon started with `--numa auto|N|interleave`
 * calls st_numa_bind_self() before it starts any thread (threads inherit the
 * CPU affinity and the memory policy), then st_numa_bind_range() on each
 * segment it owns: the policy is stored with the shm object, so pages that
 * another process (computed writing KV rows) touches first land on the
 * same node.  st_numa_query_range() asks the kernel (move_pages) where the
 * resident pages of a mapping really are, which `strata status` prints.
 */
#ifndef ST_NUMA_H
#define ST_NUMA_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_topo.h"

enum st_numa_mode {
	ST_NUMA_OFF = 0,        /* no binding (the kernel's default policy) */
	ST_NUMA_AUTO,           /* the node st_topo_pick_node() chooses */
	ST_NUMA_NODE,           /* one given node */
	ST_NUMA_INTERLEAVE,     /* memory interleaved over all nodes with
				 * memory, threads on every core */
};

struct st_numa_policy {
	enum st_numa_mode mode;
	int node;               /* ST_NUMA_NODE: the node; after resolve,
				 * AUTO's choice too */
};

#define ST_NUMA_MAX_NODES 64

/*
 * Parses "off", "auto", "interleave" or a node number ("0".."63").  0, or
 * -EINVAL with diag naming the allowed values.
 */
int st_numa_policy_parse(const char *text, struct st_numa_policy *ret,
			 struct st_diag *diag);

/* Writes the policy as text ("node 0", "interleave", "off"). */
const char *st_numa_policy_str(const struct st_numa_policy *p, char *buf,
			       size_t len);

/*
 * Resolves AUTO into a node (with topo, or loading it when topo is NULL)
 * and checks that a given node exists and has memory.  0, or -EINVAL
 * with diag ("node 3 does not exist; this machine has nodes 0-1").
 */
int st_numa_resolve(struct st_numa_policy *p, const struct st_topo *topo,
		    struct st_diag *diag);

/*
 * Binds the calling process — all its threads, present and future — to
 * the cores of the policy's node and sets its memory policy (MPOL_BIND to
 * the node, or MPOL_INTERLEAVE).  Resolves AUTO first.  OFF does nothing.
 * Writes what was done into what (may be NULL): "node 0: cpus 0-1".
 * 0, or negative with diag.
 */
int st_numa_bind_self(struct st_numa_policy *p, char *what, size_t what_len,
		      struct st_diag *diag);

/*
 * Binds [addr, addr + len) — page-aligned addr, a mapping of ours — to the
 * policy's node (MPOL_BIND) or interleaves it, moving pages already
 * present (MPOL_MF_MOVE).  On a shared mapping the policy belongs to the
 * shm object, so it holds for every process that maps it.  p must be
 * resolved (not AUTO).  OFF does nothing.  0, or -errno with diag.
 */
int st_numa_bind_range(void *addr, size_t len,
		       const struct st_numa_policy *p, struct st_diag *diag);

/*
 * Where the resident pages of [addr, addr + len) are: counts per node
 * into ret_pages[0..ST_NUMA_MAX_NODES) (4 KiB pages, indexed by node
 * number) and the number of pages that are not resident into
 * *ret_absent.  Only pages already resident are looked at (mincore), so
 * the query never allocates memory.  0, or -errno.
 */
int st_numa_query_range(const void *addr, size_t len, uint64_t *ret_pages,
			uint64_t *ret_absent);

/*
 * What a daemon's main does with its --numa TEXT (NULL or "off": nothing):
 * parse, resolve and st_numa_bind_self(); *ret gets the resolved policy for
 * st_numa_bind_range() on the segments it creates.  0, or negative with
 * diag.  Call before starting threads.
 */
int st_numa_daemon_setup(const char *text, struct st_numa_policy *ret,
			 char *what, size_t what_len, struct st_diag *diag);

/* Number of NUMA nodes the kernel has (>= 1). */
int st_numa_node_count(void);

#endif
