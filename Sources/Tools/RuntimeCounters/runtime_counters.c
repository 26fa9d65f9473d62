// Counts heap allocations by standing in for glibc's malloc, calloc, realloc and aligned
// allocations in the process that links this file (a definition in the executable takes
// precedence over the C library's for every library loaded), each passing the call on to
// glibc's own.
//
// Not the Swift runtime's hooks for Instruments (`_swift_allocObject`, `_swift_retain`): on
// Linux, Swift 6.3's runtime faults once they are installed (its retain adapter masks a
// tagged bridge object's tag away and dereferences the rest; swiftlang/swift#88924), so
// retains are counted with `perf probe` instead (docs/PERFORMANCE.md).
#include "runtime_counters.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <errno.h>
#include <stddef.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

static atomic_bool counting;
static _Thread_local uint64_t thread_allocations;
static _Atomic uint64_t process_allocations;

static inline void count(void) {
    // Off until asked for: the loader and the C library allocate before threads are set up.
    if (!atomic_load_explicit(&counting, memory_order_relaxed)) return;
    thread_allocations += 1;
    atomic_fetch_add_explicit(&process_allocations, 1, memory_order_relaxed);
}

void *malloc(size_t size) {
    count();
    return __libc_malloc(size);
}

void *calloc(size_t count_, size_t size) {
    count();
    return __libc_calloc(count_, size);
}

void *realloc(void *pointer, size_t size) {
    count();
    return __libc_realloc(pointer, size);
}

// The Swift runtime allocates what asks for an alignment of its own here.
int posix_memalign(void **result, size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) return EINVAL;
    count();
    void *pointer = __libc_memalign(alignment, size);
    if (pointer == NULL && size != 0) return ENOMEM;
    *result = pointer;
    return 0;
}

void *aligned_alloc(size_t alignment, size_t size) {
    count();
    return __libc_memalign(alignment, size);
}

void rc_install(void) {
    atomic_store_explicit(&counting, true, memory_order_relaxed);
}

rc_counts rc_this_thread(void) {
    rc_counts counts = { thread_allocations };
    return counts;
}

rc_counts rc_process(void) {
    rc_counts counts = { atomic_load_explicit(&process_allocations, memory_order_relaxed) };
    return counts;
}
