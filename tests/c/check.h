/*
 * check.h: the whole C test harness. A test binary holds cases named as sentences; main()
 * runs the one named on the command line (ctest registers each case on its own). Assertions
 * print both operands and are never compiled out (libuv's test/task.h is the model).
 */
#ifndef LEASH_CHECK_H
#define LEASH_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond) do { \
    if (!(cond)) { \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort(); \
    } } while (0)

#define CHECK_INT_EQ(a, b) do { \
    long long check_a_ = (long long)(a), check_b_ = (long long)(b); \
    if (check_a_ != check_b_) { \
      fprintf(stderr, "%s:%d: %s == %s: %lld != %lld\n", __FILE__, __LINE__, #a, #b, \
              check_a_, check_b_); \
      abort(); \
    } } while (0)

#define CHECK_STR_EQ(a, b) do { \
    const char *check_a_ = (a), *check_b_ = (b); \
    if (check_a_ == NULL || check_b_ == NULL || strcmp(check_a_, check_b_) != 0) { \
      fprintf(stderr, "%s:%d: %s == %s: \"%s\" != \"%s\"\n", __FILE__, __LINE__, #a, #b, \
              check_a_ ? check_a_ : "(null)", check_b_ ? check_b_ : "(null)"); \
      abort(); \
    } } while (0)

struct check_case {
  const char *name;
  void (*fn)(void);
};

/* Runs the case named by argv[1]; with no argument, every case in order. */
static inline int check_main(const struct check_case *cases, int argc, char **argv)
{
  int ran = 0;
  for (const struct check_case *c = cases; c->name != NULL; c++) {
    if (argc > 1 && strcmp(argv[1], c->name) != 0)
      continue;
    c->fn();
    printf("ok %s\n", c->name);
    ran++;
  }
  if (ran == 0) {
    fprintf(stderr, "no case named %s\n", argc > 1 ? argv[1] : "(none)");
    return 1;
  }
  return 0;
}

/* Runs fn with stderr sent to an unlinked temporary file; returns what fn wrote there
   (caller frees). For the cases that check what a log line looks like. */
static inline char *check_capture_stderr(void (*fn)(void))
{
  char path[] = "/tmp/leash-check-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  unlink(path);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  CHECK(dup2(fd, STDERR_FILENO) >= 0);
  fn();
  fflush(stderr);
  CHECK(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);
  off_t len = lseek(fd, 0, SEEK_END);
  CHECK(len >= 0);
  char *buf = calloc(1, (size_t)len + 1);
  CHECK(buf != NULL);
  CHECK(pread(fd, buf, (size_t)len, 0) == (ssize_t)len);
  close(fd);
  return buf;
}

#endif
