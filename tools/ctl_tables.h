/* ctl_tables.h: gmlakectl's human tables of a control reply (clients, chunks, shares), ctl_tables.c. */
#ifndef GML_CTL_TABLES_H
#define GML_CTL_TABLES_H
#include "gmlake.pb-c.h"

void ctl_print_clients(const Gmlake__CtlReply *r);          /* a row per client, then what is uncounted */
void ctl_print_chunks(const Gmlake__CtlReply *r);           /* a character a chunk: free, parked, shared, whose */
void ctl_print_shares(const Gmlake__CtlReply *r, int json); /* by hand, --json too (repeated fields: the pids) */
#endif
