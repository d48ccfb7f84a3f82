/*
 * script: one slot's Lua state. Loads the task script in the sandbox (sandbox.h: what is
 * allowed, fresh globals per task, bounded library loops), with a
 * memory cap through the allocator, then calls handle(task) under a count hook that stops
 * a task past its --task-timeout or once its lease is lost, and turns what handle gave back
 * into the task's outcome (SPEC.md, "The Lua contract"). One thread uses a state; nothing
 * Lua-side is shared between slots. The host API and the sandbox see the running task
 * through task_context.h (the state's context), never through this header.
 */
#ifndef LEASH_SCRIPT_H
#define LEASH_SCRIPT_H

#include "task_context.h"

#include <stddef.h>

struct script;

/* Loads path into a new state and checks the contract (returns handle, or a table with a
   handle function and optional setup, which runs once). NULL with the Lua error in err. */
struct script *script_load(const char *path, const struct script_host *host, char *err,
                           size_t errlen);
/* The same from text already read (path names the chunk and the folder for require). */
struct script *script_load_text(const char *path, const char *text, size_t len,
                                const struct script_host *host, char *err, size_t errlen);
/* Reads a whole file (textfile_read); malloc'd, NULL with err. For the host, which reads
   the script once and hands the text to script_load_text. */
char *script_read_file(const char *path, size_t *len, char *err, size_t errlen);
void script_free(struct script *s);

/* Runs handle(task) and fills t->out (kind, cause, error, delay, result) and t->duration. */
void script_run(struct script *s, struct task *t);

/* The version id: SHA-256 (64 hex digits) over the script's text and every module loaded
   with it (at load time, setup included), for logs, hot swap and the attempt history. */
#define SCRIPT_VERSION_LEN 64
const char *script_version(const struct script *s);
/* The label the script declares (`return { handle = ..., label = "v7" }`): at most
   TASK_LABEL_MAX bytes, no control characters; "" when it declares none. */
const char *script_label(const struct script *s);

/* 1 after an out-of-memory error left the state unfit: the caller loads a fresh one. */
int script_broken(const struct script *s);

#endif
