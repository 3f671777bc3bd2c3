/* guard.h: guard mode's SIGSEGV report (guard.c). An allocator in guard
 * mode registers itself; the handler names the block a fault overran. */
#ifndef GML_GUARD_H
#define GML_GUARD_H
#include "alloc.h"

#define GML_GUARD_BT 16 /* frames kept per allocation with GMLAKE_GUARD_BACKTRACE=1 */

int gmli_guard_register(gml_allocator *a);
void gmli_guard_unregister(gml_allocator *a);
#endif
