#ifndef RUNTIME_COUNTERS_H
#define RUNTIME_COUNTERS_H

#include <stdint.h>

/// What was counted since counting began.
typedef struct {
    /// Heap allocations (`malloc`, `calloc`, `realloc`, `posix_memalign`, `aligned_alloc`):
    /// every Swift object, array and string buffer, and libzmq's own.
    uint64_t allocations;
    /// Retains and releases of Swift objects the project's code asked the runtime for.
    uint64_t retains;
    uint64_t releases;
    /// Dynamic exclusivity checks (`swift_beginAccess`): an access to a class's stored
    /// property, a global or an escaping closure's captured variable.
    uint64_t accessChecks;
} rc_counts;

/// Starts counting, for the rest of the process; idempotent.
void rc_install(void);

/// What the calling thread allocated since counting began.
rc_counts rc_this_thread(void);

/// What every thread allocated since counting began.
rc_counts rc_process(void);

#endif
