/*
 * deadline: a point on a clock some seconds from now, and whether it has passed. The one
 * copy of the timespec arithmetic (seconds as a double, nanoseconds carried). Header only.
 */
#ifndef LEASH_DEADLINE_H
#define LEASH_DEADLINE_H

#include <time.h>

/* The time `secs` (>= 0) from now on `clock`, for comparisons or an absolute wait
   (pthread_cond_timedwait on the same clock). */
static inline struct timespec deadline_after(clockid_t clock, double secs)
{
  struct timespec ts;
  clock_gettime(clock, &ts);
  long long ns = (long long)ts.tv_nsec + (long long)((secs - (double)(time_t)secs) * 1e9);
  ts.tv_sec += (time_t)secs + (time_t)(ns / 1000000000LL);
  ts.tv_nsec = (long)(ns % 1000000000LL);
  return ts;
}

/* 1 once `clock` has reached d. */
static inline int deadline_passed(clockid_t clock, const struct timespec *d)
{
  struct timespec now;
  clock_gettime(clock, &now);
  return now.tv_sec > d->tv_sec || (now.tv_sec == d->tv_sec && now.tv_nsec >= d->tv_nsec);
}

/* Seconds from now until d on `clock`; negative once it passed. */
static inline double deadline_left(clockid_t clock, const struct timespec *d)
{
  struct timespec now;
  clock_gettime(clock, &now);
  return (double)(d->tv_sec - now.tv_sec) + (double)(d->tv_nsec - now.tv_nsec) / 1e9;
}

#endif
