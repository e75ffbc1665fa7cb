/* cli_memory.c — see cli_memory.h. */
#include "cli_memory.h"

#include <math.h>
#include <string.h>

#include "st_util.h"

int cli_check_memory(const char *memory, const char *host_floor,
		     const char *kv_floor, const char *who,
		     uint64_t *ret_bytes)
{
	uint64_t m = 0, host = 0, kv = 0;
	double pct = 0;
	char a[32], b[32], c[32], d[32];

	if (ret_bytes)
		*ret_bytes = 0;
	if (!memory || !memory[0])
		return 0;
	if (strchr(memory, '%')) {
		fprintf(stderr, "%s: --memory-budget '%s': a share is not "
			"accepted: the shared budget is bytes of host memory "
			"(e.g. 24GiB) that expertd and kvd divide between "
			"them (--host-budget takes a share of the experts)\n",
			who, memory);
		return 2;
	}
	if (st_parse_size(memory, &m) < 0) {
		fprintf(stderr, "%s: --memory-budget '%s': not a size: give "
			"%s\n", who, memory, ST_SIZE_WORDS);
		return 2;
	}
	if (!m) {
		fprintf(stderr, "%s: --memory-budget %s: give a size, or leave "
			"the option out to keep fixed budgets (in a config "
			"file: delete or comment the [memory] budget line; "
			"0 no longer means none)\n", who, memory);
		return 2;
	}
	if (ret_bytes)
		*ret_bytes = m;
	{
		struct st_diag dg = { "" };

		if (st_ledger_check_total(m, &dg) < 0) {
			fprintf(stderr, "%s: %s\n", who, dg.msg);
			return 2;
		}
	}
	/* a share of the experts is resolved by expertd (st_ledger_open
	 * refuses floors above the total, naming both) */
	if (host_floor && host_floor[0] &&
	    (st_parse_budget(host_floor, &host, &pct) < 0 || pct > 0))
		host = 0;
	if (kv_floor && kv_floor[0] && st_parse_size(kv_floor, &kv) < 0)
		kv = 0;
	if (host + kv > m) {
		char floors[128];

		if (host && kv)
			snprintf(floors, sizeof(floors), "--host-budget %s + "
				 "--kv-budget %s", st_format_bytes(host, b,
				 sizeof(b)), st_format_bytes(kv, c, sizeof(c)));
		else
			snprintf(floors, sizeof(floors), "%s %s", host ?
				 "--host-budget" : "--kv-budget",
				 st_format_bytes(host + kv, b, sizeof(b)));
		fprintf(stderr, "%s: --memory-budget %s is below the floor%s "
			"it must hold (%s); give at least %s (%llu bytes), or "
			"lower %s (with --memory-budget a side's budget is "
			"the least it gets)\n", who,
			st_format_bytes(m, a, sizeof(a)),
			host && kv ? "s" : "", floors,
			st_format_bytes(host + kv, d, sizeof(d)),
			(unsigned long long)(host + kv),
			host && kv ? "them" : "it");
		return 2;
	}
	return 0;
}

uint64_t cli_memory_kv_allowed(const struct st_ledger_view *v,
			       uint64_t n_pages)
{
	uint64_t unit = v ? v->side[ST_LEDGER_KV].unit : 0;

	if (!unit)
		return n_pages;
	return ST_MIN(v->side[ST_LEDGER_KV].target / unit, n_pages);
}

void cli_memory_kv_pages_text(const struct st_ledger_view *v, uint64_t used,
			      uint64_t n_pages, char *ret, size_t cap)
{
	uint64_t allowed = cli_memory_kv_allowed(v, n_pages);
	char a[32], b[32];

	if (!v || !v->side[ST_LEDGER_KV].unit) {
		snprintf(ret, cap, "%llu/%llu", (unsigned long long)used,
			 (unsigned long long)n_pages);
		return;
	}
	snprintf(ret, cap, "%llu/%llu (share %s of a pool of %llu pages made "
		 "for %s)", (unsigned long long)used,
		 (unsigned long long)allowed,
		 st_format_bytes(v->side[ST_LEDGER_KV].target, a, sizeof(a)),
		 (unsigned long long)n_pages,
		 st_format_bytes(v->total, b, sizeof(b)));
}

static const char *kind_name(uint32_t kind)
{
	return kind == ST_LEDGER_MOVE_DONE ? "move" :
	       kind == ST_LEDGER_MOVE_CANCELLED ? "cancelled" :
	       kind == ST_LEDGER_MOVE_GRANT ? "grant" : "unknown";
}

static const char *why_name(uint32_t why)
{
	return why == ST_LEDGER_WHY_VALUE ? "value" :
	       why == ST_LEDGER_WHY_OVER ? "over" :
	       why == ST_LEDGER_WHY_FLIP ? "flip" :
	       why == ST_LEDGER_WHY_UNASSIGNED ? "unassigned" : "unknown";
}

/* A side's name, "?" for a value out of range (the ring is read from
 * shared memory another process writes). */
static const char *side_name(uint32_t side)
{
	const char *n = st_ledger_side_name((int)side);

	return n ? n : "?";
}

/* Seconds from t_ns to now_ns (0 when t_ns is later: another clock
 * reading raced this one). */
static double ago_s(uint64_t t_ns, uint64_t now_ns)
{
	return now_ns > t_ns ? (double)(now_ns - t_ns) / 1e9 : 0.0;
}

void cli_memory_move_text(const struct st_ledger_move *m, uint64_t now_ns,
			  char *ret, size_t cap)
{
	char a[32];
	double ago = ago_s(m->t_ns, now_ns);

	st_format_bytes(m->bytes, a, sizeof(a));
	if (m->kind == ST_LEDGER_MOVE_GRANT)
		snprintf(ret, cap, "%.0f s ago: %s unassigned -> %s (%s)", ago,
			 a, side_name(m->to), why_name(m->why));
	else if (m->kind == ST_LEDGER_MOVE_CANCELLED)
		snprintf(ret, cap, "%.0f s ago: %s %s -> %s cancelled (the "
			 "donor could not free it in time; %s)", ago, a,
			 side_name(m->from), side_name(m->to),
			 why_name(m->why));
	else /* by value: the comparison that moved it; else the values */
		snprintf(ret, cap, "%.0f s ago: %s %s -> %s, gain %.2g%s "
			 "loss %.2g (%s)", ago, a, side_name(m->from),
			 side_name(m->to), m->gain,
			 m->why != ST_LEDGER_WHY_VALUE ? "," :
			 m->gain > m->loss ? " >" : " <=", m->loss,
			 why_name(m->why));
}

void cli_memory_print(FILE *f, const char *indent,
		      const struct st_ledger_view *v, uint64_t now_ns)
{
	char a[32], b[32], c[32], d[32], e[32], line[256];
	unsigned first;

	fprintf(f, "%s%-19sbudget %s shared by experts and kv, step %s; "
		"%llu moves logged\n", indent, "memory",
		st_format_bytes(v->total, a, sizeof(a)),
		st_format_bytes(v->step, b, sizeof(b)),
		(unsigned long long)v->n_moves);
	for (int s = 0; s < ST_LEDGER_SIDES; s++) {
		const typeof(v->side[0]) *x = &v->side[s];

		fprintf(f, "%s  %-17starget %s, used %s, pinned %s, floor %s, "
			"cap %s%s%s\n", indent, side_name((uint32_t)s),
			st_format_bytes(x->target, a, sizeof(a)),
			st_format_bytes(x->used, b, sizeof(b)),
			st_format_bytes(x->pinned, c, sizeof(c)),
			st_format_bytes(x->floor, d, sizeof(d)),
			st_format_bytes(x->cap, e, sizeof(e)),
			x->over ? ", over by " : "",
			x->over ? st_format_bytes(x->over, a, sizeof(a)) : "");
		fprintf(f, "%s  %-17sgain %.2g, loss %.2g (ns of stall per s "
			"per GiB); in %llu (%s), out %llu (%s), %llu "
			"cancelled%s\n", indent, "", x->gain, x->loss,
			(unsigned long long)x->moves_in,
			st_format_bytes(x->bytes_in, a, sizeof(a)),
			(unsigned long long)x->moves_out,
			st_format_bytes(x->bytes_out, b, sizeof(b)),
			(unsigned long long)x->cancelled,
			x->live ? "" : x->pid ? "; its daemon is not running" :
			"; no daemon joined");
	}
	if (v->pending)
		fprintf(f, "%s  %-17s%s from %s for %.1f s (the donor frees "
			"down to its target)\n", indent, "pending",
			st_format_bytes(v->pending, a, sizeof(a)),
			side_name(v->pend_from), ago_s(v->pend_ns, now_ns));
	first = v->n_log > CLI_MEMORY_TEXT_MOVES ?
		v->n_log - CLI_MEMORY_TEXT_MOVES : 0;
	for (unsigned i = first; i < v->n_log && i < ST_LEDGER_LOG; i++) {
		cli_memory_move_text(&v->log[i], now_ns, line, sizeof(line));
		fprintf(f, "%s  %-17s%s\n", indent, i == first ? "moves" : "",
			line);
	}
}

/* A double for JSON: NaN and infinities (values another process wrote)
 * as null. */
static json_t *json_num(double x)
{
	return isfinite(x) ? json_real(x) : json_null();
}

json_t *cli_memory_json(const struct st_ledger_view *v, uint64_t now_ns)
{
	json_t *j = json_object(), *sides = json_object(), *log = json_array();

	if (!j || !sides || !log) {
		json_decref(j);
		json_decref(sides);
		json_decref(log);
		return NULL;
	}
	json_object_set_new(j, "budget_bytes", json_integer((json_int_t)v->total));
	json_object_set_new(j, "step_bytes", json_integer((json_int_t)v->step));
	json_object_set_new(j, "moves", json_integer((json_int_t)v->n_moves));
	json_object_set_new(j, "pending", !v->pending ? json_null() : json_pack(
		"{s:I, s:s, s:f}", "bytes", (json_int_t)v->pending,
		"from", side_name(v->pend_from),
		"for_s", ago_s(v->pend_ns, now_ns)));
	for (int s = 0; s < ST_LEDGER_SIDES; s++) {
		const typeof(v->side[0]) *x = &v->side[s];
		json_t *o = json_pack(
			"{s:b, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
			"s:I, s:I, s:I, s:I}",
			"live", x->live, "pid", (int)x->pid,
			"target_bytes", (json_int_t)x->target,
			"used_bytes", (json_int_t)x->used,
			"pinned_bytes", (json_int_t)x->pinned,
			"over_bytes", (json_int_t)x->over,
			"floor_bytes", (json_int_t)x->floor,
			"cap_bytes", (json_int_t)x->cap,
			"unit_bytes", (json_int_t)x->unit,
			"moves_in", (json_int_t)x->moves_in,
			"moves_out", (json_int_t)x->moves_out,
			"bytes_in", (json_int_t)x->bytes_in,
			"bytes_out", (json_int_t)x->bytes_out,
			"cancelled", (json_int_t)x->cancelled);

		json_object_set_new(o, "gain", json_num(x->gain));
		json_object_set_new(o, "loss", json_num(x->loss));
		json_object_set_new(sides, side_name((uint32_t)s), o);
	}
	json_object_set_new(j, "sides", sides);
	for (unsigned i = 0; i < v->n_log && i < ST_LEDGER_LOG; i++) {
		const struct st_ledger_move *m = &v->log[i];
		json_t *o = json_pack(
			"{s:f, s:s, s:s, s:s, s:s, s:I, s:{s:I, s:I}}",
			"ago_s", round(ago_s(m->t_ns, now_ns) * 1e3) / 1e3,
			"kind", kind_name(m->kind), "why", why_name(m->why),
			"from", m->kind == ST_LEDGER_MOVE_GRANT ? "" :
				side_name(m->from),
			"to", side_name(m->to), "bytes", (json_int_t)m->bytes,
			"target", "experts",
			(json_int_t)m->target[ST_LEDGER_EXPERTS], "kv",
			(json_int_t)m->target[ST_LEDGER_KV]);

		json_object_set_new(o, "gain", json_num(m->gain));
		json_object_set_new(o, "loss", json_num(m->loss));
		json_array_append_new(log, o);
	}
	json_object_set_new(j, "log", log);
	return j;
}
