/* cw_threads.c — see cw_threads.h.  A job is published by bumping the
 * generation in the high half of an atomic task counter; workers spin on
 * it for a short while (a decode step runs a few hundred small jobs back
 * to back, and a futex wake costs more than a job), then sleep on a
 * condition variable.  Tasks are claimed by compare-and-swap on the
 * counter (valid only for their generation); the caller works too and
 * waits for the number of finished tasks, so a worker that the scheduler
 * keeps off the CPU (a loaded machine) never holds a job up.  The counters
 * sit on their own cache lines. */

#include "cw_threads.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define CW_SPIN_NS 100000 /* spin this long before sleeping */

/* A job as workers see it; jobs live in a small ring so that a worker
 * that wakes late never reads a descriptor being written for the job it
 * is about to claim from (a claim is only valid for its generation). */
#define CW_RING 4

struct cw_job {
	_Atomic(cw_task_fn) fn;
	_Atomic(void *) arg;
	atomic_int n_tasks;
};

struct cw_threads {
	int n_threads;
	pthread_t *tids;
	int *cpus;                 /* per thread, -1: not pinned */
	/* the creating thread and its CPU mask before cw_threads_create
	 * pinned it (restored by cw_threads_destroy on that thread, so a
	 * later pool sees every allowed CPU again) */
	pthread_t creator;
	cpu_set_t creator_mask;
	int creator_pinned;
	pthread_mutex_t mu;
	pthread_cond_t cv_job, cv_done;
	struct cw_job ring[CW_RING];
	atomic_int stop;
	/* workers asleep on cv_job, and 1 while the caller sleeps on
	 * cv_done: a job start or end takes the mutex only when someone
	 * sleeps (both sides store, then load the other's flag, seq_cst:
	 * one of the two always sees the other) */
	_Alignas(64) atomic_int n_sleeping;
	atomic_int caller_sleeping;
	/* (generation << 32) | next task index of the current job */
	_Alignas(64) atomic_uint_least64_t ctr;
	/* tasks of the current job finished */
	_Alignas(64) atomic_int done;
	_Alignas(64) unsigned generation; /* caller only */
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Claims and runs tasks of generation gen until none is left (or a newer
 * job replaced it).  The caller of cw_threads_run waits for the count of
 * finished tasks, not for the workers: a worker the scheduler left out
 * costs nothing. */
static void run_tasks(struct cw_threads *p, unsigned gen)
{
	const struct cw_job *j = &p->ring[gen % CW_RING];
	const cw_task_fn fn = atomic_load_explicit(&j->fn, memory_order_relaxed);
	void *const arg = atomic_load_explicit(&j->arg, memory_order_relaxed);
	const int n = atomic_load_explicit(&j->n_tasks, memory_order_relaxed);
	uint64_t c = atomic_load_explicit(&p->ctr, memory_order_acquire);

	for (;;) {
		if ((unsigned)(c >> 32) != gen || (int)(uint32_t)c >= n)
			return;
		if (!atomic_compare_exchange_weak_explicit(&p->ctr, &c, c + 1,
				memory_order_acq_rel, memory_order_acquire))
			continue;
		fn(arg, (int)(uint32_t)c, n);
		if (atomic_fetch_add(&p->done, 1) + 1 == n &&
		    atomic_load(&p->caller_sleeping)) {
			/* the last task: wake the caller, which sleeps */
			pthread_mutex_lock(&p->mu);
			pthread_cond_signal(&p->cv_done);
			pthread_mutex_unlock(&p->mu);
		}
		c = atomic_load_explicit(&p->ctr, memory_order_acquire);
	}
}

static void pin(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	(void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

struct worker_arg {
	struct cw_threads *p;
	int index;
};

static void *worker(void *arg)
{
	struct cw_threads *p = ((struct worker_arg *)arg)->p;
	const int index = ((struct worker_arg *)arg)->index;
	unsigned seen = 0, g;

	free(arg);
	pin(p->cpus[index]);
	for (;;) {
		uint64_t t0 = 0;

		for (int i = 0;; i++) {
			g = (unsigned)(atomic_load_explicit(&p->ctr,
					memory_order_acquire) >> 32);
			if (g != seen || atomic_load(&p->stop))
				break;
			cpu_relax();
			if ((i & 63) == 0) {
				if (!t0)
					t0 = now_ns();
				else if (now_ns() - t0 > CW_SPIN_NS)
					break;
			}
		}
		if (g == seen && !atomic_load(&p->stop)) {
			pthread_mutex_lock(&p->mu);
			atomic_fetch_add(&p->n_sleeping, 1);
			while ((g = (unsigned)(atomic_load(&p->ctr) >> 32)) ==
				       seen && !atomic_load(&p->stop))
				pthread_cond_wait(&p->cv_job, &p->mu);
			atomic_fetch_sub(&p->n_sleeping, 1);
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load(&p->stop))
			break;
		seen = g;
		run_tasks(p, g);
	}
	return NULL;
}

/* The CPUs of the process's affinity mask, in order; 0 if unknown. */
static int allowed_cpus(int *ret, int max)
{
	cpu_set_t set;
	int n = 0;

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return 0;
	for (int c = 0; c < CPU_SETSIZE && n < max; c++)
		if (CPU_ISSET(c, &set))
			ret[n++] = c;
	return n;
}

int cw_threads_create(int n_threads, struct cw_threads **ret)
{
	struct cw_threads *p;
	int n_cpus;

	if (n_threads < 1 || n_threads > 256)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->n_threads = n_threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv_job, NULL);
	pthread_cond_init(&p->cv_done, NULL);
	p->tids = calloc((size_t)n_threads, sizeof(pthread_t));
	p->cpus = calloc(256, sizeof(int));
	if (!p->tids || !p->cpus) {
		free(p->tids);
		free(p->cpus);
		free(p);
		return -ENOMEM;
	}
	/* one thread per allowed CPU, pinned, when there are enough CPUs;
	 * otherwise unpinned (the scheduler shares them) */
	n_cpus = allowed_cpus(p->cpus, 256);
	if (n_threads == 1 || n_cpus < n_threads)
		for (int i = 0; i < 256; i++)
			p->cpus[i] = -1;
	p->creator = pthread_self();
	if (p->cpus[0] >= 0 &&
	    pthread_getaffinity_np(p->creator, sizeof(p->creator_mask),
				   &p->creator_mask) == 0) {
		p->creator_pinned = 1;
		pin(p->cpus[0]);
	}
	for (int i = 1; i < n_threads; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));
		int e;

		if (!wa) {
			p->n_threads = i;
			cw_threads_destroy(p);
			return -ENOMEM;
		}
		wa->p = p;
		wa->index = i;
		e = pthread_create(&p->tids[i], NULL, worker, wa);
		if (e) {
			free(wa);
			p->n_threads = i;
			cw_threads_destroy(p);
			return -e;
		}
	}
	*ret = p;
	return 0;
}

void cw_threads_destroy(struct cw_threads *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, 1);
	pthread_cond_broadcast(&p->cv_job);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i < p->n_threads; i++)
		pthread_join(p->tids[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv_job);
	pthread_cond_destroy(&p->cv_done);
	if (p->creator_pinned && pthread_equal(pthread_self(), p->creator))
		(void)pthread_setaffinity_np(p->creator, sizeof(p->creator_mask),
					     &p->creator_mask);
	free(p->tids);
	free(p->cpus);
	free(p);
}

int cw_threads_count(const struct cw_threads *p)
{
	return p ? p->n_threads : 1;
}

void cw_threads_run(struct cw_threads *p, cw_task_fn fn, void *arg,
		    int n_tasks)
{
	struct cw_job *j;
	uint64_t t0 = 0;
	unsigned gen;

	if (!p || p->n_threads == 1 || n_tasks <= 1) {
		for (int t = 0; t < n_tasks; t++)
			fn(arg, t, n_tasks);
		return;
	}
	gen = ++p->generation;
	j = &p->ring[gen % CW_RING];
	atomic_store_explicit(&j->fn, fn, memory_order_relaxed);
	atomic_store_explicit(&j->arg, arg, memory_order_relaxed);
	atomic_store_explicit(&j->n_tasks, n_tasks, memory_order_relaxed);
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	atomic_store(&p->ctr, (uint64_t)gen << 32);
	/* wake workers that went to sleep (nothing when all spin) */
	if (atomic_load(&p->n_sleeping)) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cv_job);
		pthread_mutex_unlock(&p->mu);
	}
	run_tasks(p, gen);
	for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) <
			n_tasks; i++) {
		cpu_relax();
		if ((i & 63) == 0) {
			if (!t0)
				t0 = now_ns();
			else if (now_ns() - t0 > CW_SPIN_NS)
				break;
		}
	}
	if (atomic_load(&p->done) < n_tasks) {
		pthread_mutex_lock(&p->mu);
		atomic_store(&p->caller_sleeping, 1);
		while (atomic_load(&p->done) < n_tasks)
			pthread_cond_wait(&p->cv_done, &p->mu);
		atomic_store(&p->caller_sleeping, 0);
		pthread_mutex_unlock(&p->mu);
	}
}
