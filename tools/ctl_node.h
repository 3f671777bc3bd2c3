/* ctl_node.h: every lake of this node on one screen, nvidia-smi style
 * (gmlakectl with no command, `gmlakectl node`, `gmlakectl --device all`). */
#ifndef GML_CTL_NODE_H
#define GML_CTL_NODE_H

/* Finds the control endpoints of this node's lakes (gmlake-*.ctl in the
 * directory of GMLAKE_SOCKET when it is set, else in /run/gmlake and the
 * per-user runtime directory; a gmlake-N.ctl link and the gmlake-<UUID>.ctl
 * it points at are one lake), asks each for its stats and clients, and
 * prints one row a lake (GPU index, UUID, model, device memory, held and
 * limit, free chunks, clients, fragmentation) with its top processes by
 * bytes held; with json, an array of one object a lake. A lake that does not
 * answer is a row that says "down" and why, not a failure of the view.
 * Returns the exit status: 0, or 1 when no lake was found at all. */
int gmli_ctl_node(int json);
#endif
