/* reload: inotify watcher and the reload probe. See reload.h. */
#include "reload.h"

#include "db.h"
#include "log.h"
#include "script.h"

#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#define COALESCE_S 0.2
#define WATCH_DEPTH 4

struct reload {
  struct reload_config cfg;
  pthread_t thread;
  int inotify_fd;
  int pipe_fd[2];               /* 'r' = reload now (SIGHUP), 'q' = quit */
  char version[SCRIPT_VERSION_LEN + 1];             /* of the last version that loaded */
};

/* One bounded load: shared by the waiting caller and the loader thread; whoever finishes
   with it last frees it (refs). */
struct load_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;            /* CLOCK_MONOTONIC */
  int refs;                     /* 2 while both sides hold it */
  int done, abandoned;
  char *path, *text;
  size_t len;
  const struct script_host *sh;
  struct script *result;
  char err[DB_ERR_MAX];
};

static atomic_int loaders_stuck;

static void *reload_main(void *arg);
static void *load_main(void *arg);
static void load_job_unref(struct load_job *j);
static void watch_tree(struct reload *r, const char *path, int depth);
static void try_reload(struct reload *r, const char *why);

struct reload *reload_start(const struct reload_config *cfg)
{
  struct reload *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->cfg = *cfg;
  r->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (r->inotify_fd < 0 || pipe(r->pipe_fd) != 0) {
    log_error("hot swap: cannot watch files: %m");
    if (r->inotify_fd >= 0)
      close(r->inotify_fd);
    free(r);
    return NULL;
  }
  /* Both ends: the writer (a signal thread) must never block, and the reader drains the
     pipe until EAGAIN, then goes back to poll() for file events. */
  fcntl(r->pipe_fd[0], F_SETFL, O_NONBLOCK);
  fcntl(r->pipe_fd[1], F_SETFL, O_NONBLOCK);
  char dir[PATH_MAX];
  const char *slash = strrchr(cfg->script_path, '/');
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - cfg->script_path) : 1,
           slash ? cfg->script_path : ".");
  watch_tree(r, dir[0] ? dir : "/", 0);
  for (int i = 0; i < cfg->nlua_path; i++)
    watch_tree(r, cfg->lua_path[i], 0);
  pthread_mutex_lock(cfg->mu);
  snprintf(r->version, sizeof r->version, "%s", cfg->src->version);
  pthread_mutex_unlock(cfg->mu);
  if (pthread_create(&r->thread, NULL, reload_main, r) != 0) {
    log_error("hot swap: cannot start the watcher thread");
    close(r->inotify_fd);
    close(r->pipe_fd[0]);
    close(r->pipe_fd[1]);
    free(r);
    return NULL;
  }
  return r;
}

void reload_request(struct reload *r)
{
  ssize_t w = write(r->pipe_fd[1], "r", 1);
  (void)w;
}

void reload_stop(struct reload *r)
{
  if (!r)
    return;
  ssize_t w = write(r->pipe_fd[1], "q", 1);
  (void)w;
  pthread_join(r->thread, NULL);
  close(r->inotify_fd);
  close(r->pipe_fd[0]);
  close(r->pipe_fd[1]);
  free(r);
}

/* Watches path and its subfolders (modules live in lib/…), a few levels deep; hidden
   folders (.git) are skipped. A folder created later is picked up at the next SIGHUP only. */
static void watch_tree(struct reload *r, const char *path, int depth)
{
  if (inotify_add_watch(r->inotify_fd, path,
                        IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MOVED_FROM) < 0) {
    log_warn("hot swap: cannot watch %s: %m (SIGHUP still reloads)", path);
    return;
  }
  DIR *dir = depth < WATCH_DEPTH ? opendir(path) : NULL;
  struct dirent *e;
  while (dir && (e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.' || e->d_type != DT_DIR)
      continue;
    char sub[PATH_MAX];
    if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) < (int)sizeof sub)
      watch_tree(r, sub, depth + 1);
  }
  if (dir)
    closedir(dir);
}

static void *reload_main(void *arg)
{
  struct reload *r = arg;
  double due = 0;   /* when the coalesced file changes are acted on; 0 = none pending */
  for (;;) {
    int wait_ms = -1;
    if (due > 0) {
      double left = due - task_now();
      wait_ms = left > 0 ? (int)(left * 1000) + 1 : 0;
    }
    struct pollfd fds[2] = { { r->pipe_fd[0], POLLIN, 0 }, { r->inotify_fd, POLLIN, 0 } };
    if (poll(fds, 2, wait_ms) < 0 && errno != EINTR)
      log_warn("hot swap: poll: %m");
    if (fds[0].revents & POLLIN) {
      char c;
      while (read(r->pipe_fd[0], &c, 1) == 1) {
        if (c == 'q')
          return NULL;
        try_reload(r, "SIGHUP");
      }
    }
    if (fds[1].revents & POLLIN) {
      char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
      ssize_t n;
      while ((n = read(r->inotify_fd, buf, sizeof buf)) > 0) {
        for (char *p = buf; p < buf + n;) {
          struct inotify_event *ev = (struct inotify_event *)p;
          size_t len = ev->len ? strlen(ev->name) : 0;
          /* Lua files count, and "..data": a Kubernetes ConfigMap volume updates by
             swapping that symlink to a new folder, while the .lua names (symlinks into
             ..data) never change. Editors' swap and backup files do not count. */
          if ((len > 4 && strcmp(ev->name + len - 4, ".lua") == 0) ||
              (len == 6 && memcmp(ev->name, "..data", 6) == 0))
            due = task_now() + COALESCE_S;
          p += sizeof *ev + ev->len;
        }
      }
    }
    if (due > 0 && task_now() >= due) {
      due = 0;
      try_reload(r, "file change");
    }
  }
}

/* Loads the new version once; only a version that loads reaches the slots. A version whose
   setup does not return within the load limit is refused like one that fails. */
static void try_reload(struct reload *r, const char *why)
{
  const struct reload_config *cfg = &r->cfg;
  char err[DB_ERR_MAX];
  size_t len = 0;
  if (reload_loaders_stuck() > 0) {
    /* Each stuck setup holds a core: do not pile up another behind it. A restart clears. */
    atomic_fetch_add(&cfg->counters->reloads_refused, 1);
    log_error("hot swap (%s) refused, slots keep version %s: an earlier version's setup is "
              "still stuck; restart the worker to load a new version", why, r->version);
    return;
  }
  char *text = script_read_file(cfg->script_path, &len, err, sizeof err);
  struct script *probe = text ? reload_load_bounded(cfg->script_path, text, len, cfg->sh,
                                                    cfg->load_limit, err, sizeof err)
                              : NULL;
  if (!probe) {
    atomic_fetch_add(&cfg->counters->reloads_refused, 1);
    log_error("hot swap (%s) refused, slots keep version %s: %s", why, r->version, err);
    free(text);
    return;
  }
  int changed = strcmp(script_version(probe), r->version) != 0;
  snprintf(r->version, sizeof r->version, "%s", script_version(probe));
  script_free(probe);
  /* A SIGHUP reloads even an unchanged version (setup runs again). The version covers the
     modules loaded with the script, so a changed module is a new version; a module first
     required by a task is not in it (it is loaded afresh by each task anyway). */
  pthread_mutex_lock(cfg->mu);
  free(cfg->src->text);
  cfg->src->text = text;
  cfg->src->len = len;
  cfg->src->generation++;
  snprintf(cfg->src->version, sizeof cfg->src->version, "%s", r->version);
  pthread_mutex_unlock(cfg->mu);
  atomic_fetch_add(&cfg->counters->reloads_loaded, 1);
  log_info("hot swap (%s): slots load version %s between tasks%s", why, r->version,
           changed ? "" : " (unchanged: setup runs again)");
}

struct script *reload_load_bounded(const char *path, const char *text, size_t len,
                                   const struct script_host *sh, double limit_s, char *err,
                                   size_t errlen)
{
  struct load_job *j = calloc(1, sizeof *j);
  if (j) {
    j->path = strdup(path);
    j->text = malloc(len ? len : 1);
  }
  if (!j || !j->path || !j->text) {
    snprintf(err, errlen, "out of memory loading %s", path);
    if (j) {
      free(j->path);
      free(j->text);
    }
    free(j);
    return NULL;
  }
  memcpy(j->text, text, len);
  j->len = len;
  j->sh = sh;
  j->refs = 2;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&j->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&j->mu, NULL);
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  /* Signals stay with the signal thread: this one inherits the caller's mask (blocked). */
  int rc = pthread_create(&thread, &attr, load_main, j);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    snprintf(err, errlen, "cannot start a thread to load %s", path);
    j->refs = 1;
    load_job_unref(j);
    return NULL;
  }
  double deadline = task_now() + limit_s;
  struct script *s = NULL;
  pthread_mutex_lock(&j->mu);
  while (!j->done) {
    double left = deadline - task_now();
    if (left <= 0)
      break;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(left * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
  }
  if (j->done) {
    s = j->result;
    j->result = NULL;
    if (!s)
      snprintf(err, errlen, "%s", j->err);
  } else {
    j->abandoned = 1;
    atomic_fetch_add(&loaders_stuck, 1);
    snprintf(err, errlen, "setup did not return within %.0f s (wedged inside one C call?); "
             "its thread is abandoned", limit_s);
  }
  pthread_mutex_unlock(&j->mu);
  load_job_unref(j);
  return s;
}

int reload_loaders_stuck(void)
{
  return atomic_load(&loaders_stuck);
}

static void *load_main(void *arg)
{
  struct load_job *j = arg;
  char err[DB_ERR_MAX];
  struct script *s = script_load_text(j->path, j->text, j->len, j->sh, err, sizeof err);
  pthread_mutex_lock(&j->mu);
  if (j->abandoned) {
    /* Nobody waits any more: the caller went on without this version. */
    atomic_fetch_sub(&loaders_stuck, 1);
    pthread_mutex_unlock(&j->mu);
    script_free(s);
  } else {
    j->result = s;
    if (!s)
      snprintf(j->err, sizeof j->err, "%s", err);
    j->done = 1;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
  }
  load_job_unref(j);
  return NULL;
}

static void load_job_unref(struct load_job *j)
{
  pthread_mutex_lock(&j->mu);
  int last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last)
    return;
  script_free(j->result);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j->path);
  free(j->text);
  free(j);
}
