/*
 * st_devimporter.c — the importer side of a device pool, shared by expertd
 * and kvd (st_devimporter.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "st_devimporter.h"
#include "st_log.h"
#include "st_util.h"

void st_devimporter_init(struct st_devimporter *m, uint32_t kind,
			 const char *instance, void *host_base,
			 uint64_t host_bytes)
{
	memset(m, 0, sizeof(*m));
	st_devimport_init(&m->st, kind);
	m->instance = instance;
	snprintf(m->tab_kind, sizeof(m->tab_kind), "dev%s",
		 st_devpool_kind_name(kind));
	m->host_base = host_base;
	m->host_bytes = host_bytes;
}

/* Drains the copy stream and closes every handle (the lease ends). */
static void import_close(struct st_devimporter *m)
{
	struct st_diag diag = { "" };
	int n;

	if (m->tab)
		atomic_store(&m->tab->epoch, 0); /* no new pins */
	if (!m->cu)
		return;
	n = st_cuda_import_close(m->cu, &diag);
	if (diag.msg[0])
		st_warn("device pool %s: %s", m->tab_kind, diag.msg);
	m->cu = NULL;
	if ((uint32_t)n != m->st.handles_open)
		st_warn("device pool %s: closed %d handles, %u were open",
			m->tab_kind, n, m->st.handles_open);
	st_info("device pool %s: epoch %llu released (%d handles closed)",
		m->tab_kind, (unsigned long long)m->st.epoch, n);
	st_devimport_closed(&m->st);
	/* a dead exporter's memory or events used after the driver freed
	 * them may leave a sticky error: every later import would fail */
	diag.msg[0] = 0;
	if (st_cuda_built() && st_cuda_context_check(&diag) < 0) {
		m->cuda_broken = 1;
		snprintf(m->broken_msg, sizeof(m->broken_msg), "%s",
			 diag.msg);
		st_err("device pool %s: %s; this daemon cannot import a "
		       "device pool again until it is restarted",
		       m->tab_kind, diag.msg);
	}
}

/* Maps (creating when needed) the slot table segment for n_slots. */
static int table_map(struct st_devimporter *m, uint32_t n_slots,
		     struct st_diag *diag)
{
	uint64_t need = ST_SHM_HEADER_BYTES + st_devslot_table_bytes(n_slots);
	uint64_t hash = 0x44455653ull ^ ((uint64_t)n_slots << 20);
	int r;

	if (m->tab && m->n_slots == n_slots)
		return 0;
	if (m->tab_shm.base)
		st_shm_destroy(&m->tab_shm);
	m->tab = NULL;
	r = st_shm_open_owner(&m->tab_shm, m->instance, m->tab_kind,
			      ST_DEVSLOT_SHM_VERSION, hash, need, diag);
	if (r < 0)
		return r;
	m->tab = (struct st_devslot_table *)((uint8_t *)m->tab_shm.base +
					     ST_SHM_HEADER_BYTES);
	if (r == 0 || st_devslot_table_check(m->tab, need -
					     ST_SHM_HEADER_BYTES, NULL) < 0)
		memset(m->tab, 0, sizeof(*m->tab)); /* fresh: no kept pins */
	m->n_slots = n_slots;
	return 0;
}

static int import_open(struct st_devimporter *m,
		       const struct st_devpool_export *e, struct st_diag *diag)
{
	int r, same;

	if (m->cuda_broken)
		return st_diag_set(diag, -ST_E_CUDA, "the %s importer's CUDA "
				   "context broke when an earlier exporter "
				   "died (%s): restart this daemon",
				   m->tab_kind, m->broken_msg);
	if (e->slot_bytes < m->min_slot_bytes)
		return st_diag_set(diag, -ST_E_BUDGET,
				   "device %s slots of %llu bytes are smaller "
				   "than one record (%llu bytes); computed "
				   "must size slots from the store",
				   m->tab_kind,
				   (unsigned long long)e->slot_bytes,
				   (unsigned long long)m->min_slot_bytes);
	r = table_map(m, e->n_slots, diag);
	if (r < 0)
		return r;
	st_devimporter_host_ready(m); /* pinning starts in the background */
	r = st_cuda_import_open(&m->cu, e, diag);
	if (r < 0)
		return r;
	/* the same epoch after this daemon restarted: the exporter is alive
	 * and may hold pins; the bytes of slots whose copy the dead
	 * importer had enqueued are not trusted (all slots start EMPTY) */
	same = m->tab->magic == ST_DEVSLOT_TABLE_MAGIC &&
	       atomic_load(&m->tab->epoch) == e->epoch;
	if (same && m->before_reset) {
		m->slot_bytes = e->slot_bytes;
		m->n_events = e->n_events;
		m->before_reset(m->cb_ctx, m);
	}
	st_devslot_table_reset(m->tab, e->epoch, e->n_slots, e->n_events,
			       e->slot_bytes, same);
	m->slot_bytes = e->slot_bytes;
	m->n_events = e->n_events;
	st_devimport_opened(&m->st, (int32_t)e->pid, e->epoch,
			    st_cuda_import_handles(m->cu));
	st_info("device pool %s: imported epoch %llu from pid %u (%u slots "
		"of %llu bytes, %u events, device %s)", m->tab_kind,
		(unsigned long long)e->epoch, e->pid, e->n_slots,
		(unsigned long long)e->slot_bytes, e->n_events, e->bus_id);
	return 0;
}

int st_devimporter_handle(struct st_devimporter *m, uint16_t type,
			  const uint8_t *payload, size_t len,
			  struct st_wbuf *rep, int *ret_reset,
			  struct st_diag *diag)
{
	struct st_devpool_rep out;
	int r, plan;

	*ret_reset = 0;
	if (type == ST_MSG_DEV_EXPORT) {
		struct st_devpool_export e;

		r = st_devpool_export_decode(payload, len, &e, diag);
		if (r < 0)
			return r;
		if (e.kind != m->st.kind)
			return st_diag_set(diag, -ST_E_PROTO,
					   "this daemon imports the %s device "
					   "pool, not %s", st_devpool_kind_name(
					   m->st.kind),
					   st_devpool_kind_name(e.kind));
		if (!st_cuda_built())
			return st_cuda_import_open(&m->cu, &e, diag);
		m->exports++;
		plan = st_devimport_plan_export(&m->st, &e);
		if (plan & ST_DEVIMPORT_CLOSE)
			import_close(m);
		if (plan & ST_DEVIMPORT_OPEN) {
			*ret_reset = 1;
			r = import_open(m, &e, diag);
			if (r < 0) {
				import_close(m);
				return r;
			}
		}
	} else if (type == ST_MSG_DEV_REVOKE) {
		struct st_devpool_revoke rv;

		r = st_devpool_revoke_decode(payload, len, &rv, diag);
		if (r < 0)
			return r;
		m->revokes++;
		if (st_devimport_plan_revoke(&m->st, &rv) == ST_DEVIMPORT_CLOSE) {
			*ret_reset = 1;
			import_close(m);
		}
	} else {
		return st_diag_set(diag, -ST_E_PROTO,
				   "not a device pool message: 0x%04x", type);
	}
	st_devimport_rep(&m->st, (uint32_t)getpid(), &out);
	st_devpool_rep_encode(rep, &out);
	return 0;
}

static void *pin_main(void *arg)
{
	struct st_devimporter *m = arg;
	struct st_diag diag = { "" };
	const uint64_t t0 = st_now_ns();

	if (st_cuda_host_register(m->host_base, m->host_bytes, &diag) == 0) {
		st_info("%s: host pool of %.1f GiB pinned in %.1f s",
			m->tab_kind, (double)m->host_bytes / (1 << 30),
			(double)(st_now_ns() - t0) / 1e9);
		atomic_store(&m->host_state, ST_DEVIMPORT_HOST_PINNED);
	} else {
		st_warn("%s: host pool not pinned (%s); device copies go "
			"through pageable memory, slower", m->tab_kind,
			diag.msg);
		atomic_store(&m->host_state, ST_DEVIMPORT_HOST_FAILED);
	}
	return NULL;
}

int st_devimporter_host_ready(struct st_devimporter *m)
{
	if (!m->host_base || !m->host_bytes)
		return 1;
	if (!m->pin_started) {
		atomic_store(&m->host_state, ST_DEVIMPORT_HOST_PINNING);
		if (pthread_create(&m->pin_thread, NULL, pin_main, m) != 0) {
			st_warn("%s: no thread to pin the host pool; device "
				"copies go through pageable memory",
				m->tab_kind);
			atomic_store(&m->host_state,
				     ST_DEVIMPORT_HOST_FAILED);
			return 1;
		}
		m->pin_started = 1;
	}
	return atomic_load(&m->host_state) != ST_DEVIMPORT_HOST_PINNING;
}

int st_devimporter_tick(struct st_devimporter *m)
{
	if (st_devimport_plan_peer(&m->st, NULL, NULL) != ST_DEVIMPORT_CLOSE)
		return 0;
	st_warn("device pool %s: exporter pid %d died; dropping epoch %llu",
		m->tab_kind, m->st.exporter_pid,
		(unsigned long long)m->st.epoch);
	m->peer_deaths++;
	import_close(m);
	return 1;
}

void st_devimporter_fini(struct st_devimporter *m, int destroy_table)
{
	import_close(m);
	if (m->pin_started) {
		pthread_join(m->pin_thread, NULL);
		m->pin_started = 0;
		if (atomic_load(&m->host_state) == ST_DEVIMPORT_HOST_PINNED)
			st_cuda_host_unregister(m->host_base);
	}
	atomic_store(&m->host_state, ST_DEVIMPORT_HOST_NONE);
	if (m->tab_shm.base) {
		if (destroy_table)
			st_shm_destroy(&m->tab_shm);
		else
			st_shm_detach(&m->tab_shm);
	}
	m->tab = NULL;
}
