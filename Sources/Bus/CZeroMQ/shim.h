#ifndef SWITCHBOARD_CZEROMQ_SHIM_H
#define SWITCHBOARD_CZEROMQ_SHIM_H

// libzmq's headers live in /usr/include on Debian (libzmq3-dev), so this module needs
// no pkg-config flags: `pkg-config --cflags libzmq` carries `-isystem` flags that SwiftPM
// would reject with a warning on every build.
#include <zmq.h>
#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <sys/prctl.h>
// malloc_trim and mallinfo2, which Swift's Glibc module leaves out: the kernel gives
// memory back after a flood (Kernel/HeapTrim.swift).
#include <malloc.h>

// libzmq's own error numbers are macros built from ZMQ_HAUSNUMERO; expose them as
// constants so Swift sees plain values.
static const int czmq_ETERM = ETERM;
static const int czmq_EFSM = EFSM;
static const int czmq_EHOSTUNREACH = EHOSTUNREACH;
static const int czmq_EMTHREAD = EMTHREAD;
static const int czmq_ENOCOMPATPROTO = ENOCOMPATPROTO;

// Names the calling thread (shown by `top -H` and debuggers); at most 15 bytes are kept.
static inline void czmq_name_current_thread(const char *name) {
    prctl(PR_SET_NAME, name, 0, 0, 0);
}

#endif
