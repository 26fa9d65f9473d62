#ifndef RUNTIME_COUNTERS_H
#define RUNTIME_COUNTERS_H

#include <stdint.h>

/// Heap allocations (`malloc`, `calloc`, `realloc`, `posix_memalign`, `aligned_alloc`) made
/// since counting began: every Swift
/// object, array and string buffer, and libzmq's own.
typedef struct {
    uint64_t allocations;
} rc_counts;

/// Starts counting, for the rest of the process; idempotent.
void rc_install(void);

/// What the calling thread allocated since counting began.
rc_counts rc_this_thread(void);

/// What every thread allocated since counting began.
rc_counts rc_process(void);

#endif
