/* backends.h: the tests' backends (tests/backends.c), built into the test
 * binaries and not into the library: fake events and a driver's costs, each
 * over the library's host backend. */
#ifndef GML_TESTS_BACKENDS_H
#define GML_TESTS_BACKENDS_H
#include "backend.h"

/* Fake events: the host has no asynchronous work, so to exercise stream
 * ordering a test drives it by hand. Each stream has work enqueued (launch)
 * and work done (progress); an event recorded on a stream is done once that
 * stream's work up to where it was recorded is done; stream_wait_event holds
 * the waiting stream's later work until the event is done (and orders it
 * after everything the event's stream was ordered after); synchronize
 * completes all work. At most 64 streams. */
int gml_host_fake_events(gml_backend *be); /* switch a host backend to fake events (before use) */
/* One more unit of work on `stream`; returns its position (1, 2, ...). */
uint64_t gml_host_fake_launch(gml_backend *be, uintptr_t stream);
/* Let up to n more units of `stream` complete (a pending wait stops it). */
void gml_host_fake_progress(gml_backend *be, uintptr_t stream, uint64_t n);
/* Is the work at position pos of stream `from` ordered before any work
 * enqueued on `to` from now on: done, or the same stream, or `to` waits
 * (directly or through other streams) on an event recorded after it? */
int gml_host_fake_ordered(gml_backend *be, uintptr_t from, uint64_t pos, uintptr_t to);
/* Work enqueued on `stream` so far, and the waits inserted on any stream. */
uint64_t gml_host_fake_position(gml_backend *be, uintptr_t stream);
uint64_t gml_host_fake_waits(gml_backend *be);

/* A driver's costs (gml-testclient's `cost`): installed (before any backend
 * opens), every host backend this process opens spends, spinning, import_ns
 * per chunk imported, unmap_ns per chunk unmapped and access_ns per chunk
 * given access, as gml_host_test_costs last said (all 0 at first: no cost). */
int gml_host_test_costs_install(void);
void gml_host_test_costs(uint64_t import_ns, uint64_t unmap_ns, uint64_t access_ns);
#endif
