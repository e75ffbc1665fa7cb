/* cw_threads.c — see cw_threads.h.  Workers wait on a condition variable
 * for a new job generation, take task numbers from an atomic counter and
 * count completions; the caller works too. */
#include "cw_threads.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct cw_threads {
	int n_threads;
	pthread_t *tids;
	pthread_mutex_t mu;
	pthread_cond_t cv_job, cv_done;
	unsigned long generation;  /* bumped per job, under mu */
	int stop;
	cw_task_fn fn;
	void *arg;
	int n_tasks;
	atomic_int next_task;
	int n_busy;                /* workers still in the job, under mu */
};

static void run_tasks(struct cw_threads *p)
{
	for (;;) {
		int t = atomic_fetch_add(&p->next_task, 1);

		if (t >= p->n_tasks)
			break;
		p->fn(p->arg, t, p->n_tasks);
	}
}

static void *worker(void *arg)
{
	struct cw_threads *p = arg;
	unsigned long seen = 0;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->stop && p->generation == seen)
			pthread_cond_wait(&p->cv_job, &p->mu);
		if (p->stop)
			break;
		seen = p->generation;
		pthread_mutex_unlock(&p->mu);
		run_tasks(p);
		pthread_mutex_lock(&p->mu);
		if (--p->n_busy == 0)
			pthread_cond_signal(&p->cv_done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int cw_threads_create(int n_threads, struct cw_threads **ret)
{
	struct cw_threads *p;

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
	if (!p->tids) {
		free(p);
		return -ENOMEM;
	}
	for (int i = 1; i < n_threads; i++) {
		int e = pthread_create(&p->tids[i], NULL, worker, p);

		if (e) {
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
	p->stop = 1;
	pthread_cond_broadcast(&p->cv_job);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i < p->n_threads; i++)
		pthread_join(p->tids[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv_job);
	pthread_cond_destroy(&p->cv_done);
	free(p->tids);
	free(p);
}

int cw_threads_count(const struct cw_threads *p)
{
	return p ? p->n_threads : 1;
}

void cw_threads_run(struct cw_threads *p, cw_task_fn fn, void *arg,
		    int n_tasks)
{
	if (!p || p->n_threads == 1 || n_tasks <= 1) {
		for (int t = 0; t < n_tasks; t++)
			fn(arg, t, n_tasks);
		return;
	}
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->arg = arg;
	p->n_tasks = n_tasks;
	atomic_store(&p->next_task, 0);
	p->n_busy = p->n_threads - 1;
	p->generation++;
	pthread_cond_broadcast(&p->cv_job);
	pthread_mutex_unlock(&p->mu);
	run_tasks(p);
	pthread_mutex_lock(&p->mu);
	while (p->n_busy > 0)
		pthread_cond_wait(&p->cv_done, &p->mu);
	pthread_mutex_unlock(&p->mu);
}
