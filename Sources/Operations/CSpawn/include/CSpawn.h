// The file actions of posix_spawn that glibc declares only for _GNU_SOURCE, which Swift's
// Glibc module is not built with: closing every descriptor from one on, and changing the
// working directory, in the child.
#pragma once
#include <spawn.h>

int sb_spawn_file_actions_addclosefrom(posix_spawn_file_actions_t *actions, int from);
int sb_spawn_file_actions_addchdir(posix_spawn_file_actions_t *actions, const char *path);
